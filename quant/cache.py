"""Quantized checkpoints on disk, keyed by what makes them: quantization runs once per model,
method and settings. The key hashes the model's files (config and weight file names, sizes and
times), the method, its settings, the calibration text, this package's save format and the
torch version (packed int4 layouts are torch's own).

A checkpoint keeps the model folder it was made from, and a hit refreshes its modification time:
what a cache's pruning needs to tell an entry nobody can use (its model is gone) or nobody uses
(the harness prunes with harness/core/cacheprune.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

import quant

log = logging.getLogger(__name__)


def model_fingerprint(model_dir: Path) -> dict[str, Any]:
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    return {"dir": str(model_dir.resolve()),
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def key(model_dir: Path, name: str, settings: dict[str, Any], variant: dict[str, Any] | None = None) -> str:
    full = {**quant.settings_of(name), **settings}  # defaults too: a changed default is another checkpoint
    described = {k: (v.describe() if hasattr(v, "describe") else v) for k, v in sorted(full.items())}
    doc = {"model": model_fingerprint(model_dir), "method": name, "settings": described,
           "format": quant.SAVE_FORMAT, "torch": torch.__version__}
    if variant:  # the model was changed before quantizing (e.g. a draft's smaller output layer)
        doc["variant"] = variant
    blob = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_quantize(model: Any, name: str, model_dir: Path, cache_dir: Path, *, progress: bool = True,
                    variant: dict[str, Any] | None = None, **settings: Any) -> tuple[Any, quant.QuantRecord]:
    """`quant.quantize`, or the saved result of the same call if there is one."""
    path = cache_dir / f"{model_dir.name}-{name}-{key(model_dir, name, settings, variant)}.pt"
    if path.exists():
        try:
            model, record = quant.load(model, path)
            log.info("%s: quantized layers from %s", name, path)
            _mark_used(path)
            return model, record
        except quant.QuantSettingsError as exc:
            log.warning("%s; quantizing again", exc)
    model, record = quant.quantize(model, name, progress=progress, **settings)
    quant.save(model, record, path, source=str(model_dir.resolve()))
    log.info("%s: quantized in %.1f s, saved %s", name, record.seconds, path)
    return model, record


def _mark_used(path: Path) -> None:
    """A use of the checkpoint at `path`: its modification time, which pruning reads as its last use."""
    try:
        os.utime(path)
    except OSError as exc:
        log.debug("%s: last use not recorded: %s", path, exc)


def entries(cache_dir: Path) -> list[Path]:
    """The complete checkpoints in `cache_dir` (not a save in progress)."""
    if not cache_dir.is_dir():
        return []
    return sorted(p for p in cache_dir.glob("*.pt") if not p.name.startswith(quant.PARTIAL_PREFIX))


def source_gone(path: Path) -> bool:
    """True when the model folder the checkpoint at `path` was made from no longer exists (nothing
    can ask for it again: its key hashes that folder's files). False where the checkpoint names
    none (saved before it kept one) or cannot be read (quant.load says what to do with it)."""
    try:
        saved = quant.open_checkpoint(path)
    except quant.QuantSettingsError:  # damaged or not a checkpoint: not ours to judge here
        return False
    source = saved.get("source") if isinstance(saved, dict) else None
    return bool(source) and not Path(source).exists()
