"""Calibration and held-out text (quant/corpus.toml) as token windows, and the per-layer input
statistics that AWQ and SmoothQuant compute their scales from."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quant.layers import QuantSettingsError

log = logging.getLogger(__name__)
CORPUS = Path(__file__).with_name("corpus.toml")
SPLITS = ("calibration", "heldout")


def corpus_text(split: str, corpus: Path = CORPUS) -> str:
    if split not in SPLITS:
        raise QuantSettingsError(f"unknown text split {split!r}; available: {', '.join(SPLITS)}")
    try:
        spec = tomllib.loads(corpus.read_text())[split]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise QuantSettingsError(f"{corpus}: cannot read [{split}] ({exc}); restore the file from git") from None
    parts = []
    for module in spec.get("stdlib", []):
        found = importlib.util.find_spec(module)
        if found is None or not found.origin or not found.origin.endswith(".py"):
            raise QuantSettingsError(f"{corpus}: [{split}].stdlib: {module!r} has no Python source here")
        parts.append(Path(found.origin).read_text(encoding="utf-8"))
    if "pydoc_topics" in spec:
        from pydoc_data.topics import topics

        start, stop = spec["pydoc_topics"]
        parts += [topics[k] for k in sorted(topics)[start:stop]]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class TokenWindows:
    split: str
    ids: torch.Tensor       # [windows, seq_len] int64
    text_sha256: str

    def describe(self) -> dict[str, Any]:
        return {"split": self.split, "windows": self.ids.shape[0], "seq_len": self.ids.shape[1],
                "text_sha256": self.text_sha256}


def token_windows(tokenizer: Any, split: str = "calibration", *, windows: int | None = None,
                  seq_len: int | None = None, corpus: Path = CORPUS) -> TokenWindows:
    spec = tomllib.loads(corpus.read_text())[split]
    windows = windows or spec["windows"]
    seq_len = seq_len or spec["seq_len"]
    text = corpus_text(split, corpus)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    need = windows * seq_len
    if len(ids) < need:
        raise QuantSettingsError(f"{corpus}: [{split}] gives {len(ids)} tokens, {windows} windows of {seq_len} "
                                 f"need {need}; add modules to [{split}].stdlib or ask for fewer windows")
    return TokenWindows(split, ids[:need].reshape(windows, seq_len).clone(),
                        hashlib.sha256(text.encode()).hexdigest())


@dataclass
class InputStats:
    """What a linear layer saw on the calibration windows."""
    abs_mean: torch.Tensor  # [in_features] mean |x| per input channel (AWQ)
    abs_max: torch.Tensor   # [in_features] max |x| per input channel (SmoothQuant)
    sample: torch.Tensor    # [rows, in_features] float32, a fixed random subset of token rows


@torch.no_grad()
def collect_input_stats(model: torch.nn.Module, calibration: TokenWindows, names: list[str], *,
                        rows: int = 256, progress: bool = True) -> dict[str, InputStats]:
    """Run the calibration windows through `model` once, with a hook on every named linear."""
    from tqdm.auto import tqdm

    modules = dict(model.named_modules())
    n_windows = calibration.ids.shape[0]
    per_window = max(1, rows // n_windows)
    gen = torch.Generator().manual_seed(0)
    sums: dict[str, torch.Tensor] = {}
    maxes: dict[str, torch.Tensor] = {}
    samples: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    count = 0

    def hook(name: str):
        def fn(_module: Any, args: tuple, _out: Any) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            a = x.abs()
            sums[name] = sums[name] + a.sum(0) if name in sums else a.sum(0)
            maxes[name] = torch.maximum(maxes[name], a.amax(0)) if name in maxes else a.amax(0)
            pick = torch.randperm(x.shape[0], generator=gen)[:per_window]
            samples[name].append(x[pick].clone())
        return fn

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        for i in tqdm(range(n_windows), desc="calibration forward", unit="window", disable=not progress):
            model(calibration.ids[i:i + 1])
            count += calibration.ids.shape[1]
    finally:
        for h in handles:
            h.remove()
    return {n: InputStats(sums[n] / count, maxes[n], torch.cat(samples[n])) for n in names}
