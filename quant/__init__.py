"""Weight quantization: one module per method behind one small interface.

    model, record = quantize(model, "w4abf16", calibration=token_windows(tokenizer))

`record` says what was done (method, settings, layers converted, seconds) and goes into results.
`save` / `load` keep a quantized model's converted layers on disk; `harness.workload.models.load` caches
them by a hash of model, method, settings, calibration text and library versions (quant/cache.py).

| method        | weights                     | activations            | kernel                          |
|---------------|-----------------------------|------------------------|---------------------------------|
| w8af32        | int8 per output channel     | int8 per token, fp32   | torch._int_mm                   |
| w8af32-tensor | int8 per output channel     | int8 per tensor, fp32  | torch.ao dynamic (fbgemm)       |
| w8abf16       | int8 per output channel     | bf16                   | aten._weight_int8pack_mm        |
| w8a8          | SmoothQuant, int8 per chan. | int8 per token, fp32   | torch._int_mm                   |
| w4abf16       | AWQ, 4-bit per group of 128 | bf16                   | aten._weight_int4pack_mm_for_cpu|
| w4abf16-rtn   | round-to-nearest 4-bit      | bf16                   | aten._weight_int4pack_mm_for_cpu|
| w6a16         | AWQ, 6-bit per group of 128 | bf16                   | aten._weight_int8pack_mm        |
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quant.layers import QuantSettingsError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Method:
    module: str
    base_dtype: str            # the float dtype (torch attribute name) the model is loaded in first
    calibrated: bool = False   # needs calibration token windows


_METHODS: dict[str, Method] = {
    "w8af32": Method("quant.w8af32", "float32"),
    "w8af32-tensor": Method("quant.w8af32_tensor", "float32"),
    "w8abf16": Method("quant.w8abf16", "bfloat16"),
    "w8a8": Method("quant.smoothquant", "float32", calibrated=True),
    "w4abf16": Method("quant.awq", "bfloat16", calibrated=True),
    "w4abf16-rtn": Method("quant.rtn", "bfloat16"),
    "w6a16": Method("quant.w6a16", "bfloat16", calibrated=True),
}
SAVE_FORMAT = 3  # 2: Int8DynamicLinear keeps weight_q [N, K]; 3: the float vectors too (AWQ's folded norms)


@dataclass
class QuantRecord:
    method: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: int = 0
    seconds: float = 0.0
    cached: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def methods() -> tuple[str, ...]:
    return tuple(_METHODS)


def method(name: str) -> Method:
    if name not in _METHODS:
        close = difflib.get_close_matches(name, _METHODS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise QuantSettingsError(f"unknown quantization method {name!r}.{hint} Available: {', '.join(_METHODS)}")
    return _METHODS[name]


def base_dtype(name: str) -> str:
    return method(name).base_dtype


def settings_of(name: str) -> dict[str, Any]:
    """The settings a method takes, with their defaults."""
    fn = importlib.import_module(method(name).module).quantize
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.name != "progress"}


def quantize(model: Any, name: str, *, progress: bool = True, **settings: Any) -> tuple[Any, QuantRecord]:
    known = settings_of(name)
    for key in settings:
        if key not in known:
            raise QuantSettingsError(f"{name} has no setting {key!r}; its settings: "
                                     f"{', '.join(known) or '(none)'}")
    module = importlib.import_module(method(name).module)
    start = time.perf_counter()
    model, layers, used = module.quantize(model, progress=progress, **settings)
    return model, QuantRecord(method=name, settings=used, layers=layers, seconds=time.perf_counter() - start)


# A save in progress writes PARTIAL_PREFIX + its process id + "-" + the file's name beside it: a save
# killed half-way (checkpoints are GBs) is recognisable, and removed once its process is gone
# (harness/core/locks.py `sweep`, called by the harness before it quantizes into its cache).
PARTIAL_PREFIX = ".partial-"


def save(model: Any, record: QuantRecord, path: Path, *, source: str | None = None) -> None:
    """Write the converted layers, the float vectors outside them (norm weights, biases: a method
    may fold scales into them, as AWQ does; a few hundred KB) and the record to one file,
    atomically (temporary, fsync, rename). `source`: the model folder it was made from, kept so
    that a cache can tell a checkpoint whose model is gone (quant/cache.py `source_gone`)."""
    import torch

    from quant.layers import LAYER_CLASSES, layer_meta

    layers = {name: {"meta": layer_meta(m), "state": m.saved_state()}
              for name, m in model.named_modules() if type(m).__name__ in LAYER_CLASSES}
    vectors = {name: p.detach().clone() for name, p in model.named_parameters()
               if p.ndim == 1 and p.is_floating_point() and name.rpartition(".")[0] not in layers}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{PARTIAL_PREFIX}{os.getpid()}-{path.name}")
    try:
        with open(tmp, "wb") as fh:
            torch.save({"format": SAVE_FORMAT, "record": record.as_dict(), "layers": layers, "vectors": vectors,
                        "source": source}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_checkpoint(path: Path) -> Any:
    """What `save` wrote to `path`, its tensors mapped from the file, not read: they are the file's
    pages (private: a write copies a page), so opening one copies no weight, and the two arms of a
    gate that load one checkpoint share its pages (what that saves a gate's start:
    docs/perf-gate.md, "A round"). Where the filesystem cannot map the file, it is read instead.
    Raises QuantSettingsError naming the file when it is not a readable torch file."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as mapped:  # noqa: BLE001 - truncated, not a torch file, or a file that cannot be mapped
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise QuantSettingsError(f"{path}: not a readable quantized checkpoint ({exc.__class__.__name__}); "
                                     "delete it and quantize again") from None
        log.warning("%s: read into memory, not mapped (%s: %s)", path, type(mapped).__name__, mapped)
        return saved


def load(model: Any, path: Path) -> tuple[Any, QuantRecord]:
    """Swap the saved quantized layers into `model` (the same architecture, loaded in the method's
    base dtype) and set the saved float vectors; the float weights of those layers are dropped."""
    import torch

    from quant.layers import restore_layer
    from quant.walk import replace

    saved = open_checkpoint(path)
    if not isinstance(saved, dict) or saved.get("format") != SAVE_FORMAT:
        raise QuantSettingsError(f"{path}: checkpoint format {saved.get('format') if isinstance(saved, dict) else '?'}"
                                 f", this code reads {SAVE_FORMAT}; delete it and quantize again")
    # Checked whole, and every layer rebuilt, before the model is touched: a checkpoint that does
    # not fit leaves the model as it was, to be quantized again from the float weights.
    modules, params = dict(model.named_modules()), dict(model.named_parameters())
    for name in saved["layers"]:
        if name not in modules:
            raise QuantSettingsError(f"{path}: layer {name!r} is not in this model; the checkpoint belongs to "
                                     "another architecture")
    for name, value in saved["vectors"].items():
        if name not in params or params[name].shape != value.shape:
            raise QuantSettingsError(f"{path}: parameter {name!r} is not in this model or has another shape; "
                                     "the checkpoint belongs to another architecture")
    try:
        layers = {name: restore_layer(entry["meta"], entry["state"]) for name, entry in saved["layers"].items()}
    except Exception as exc:  # noqa: BLE001 - a layer the checkpoint describes wrongly
        raise QuantSettingsError(f"{path}: a saved layer cannot be rebuilt ({type(exc).__name__}: {exc}); delete it "
                                 "and quantize again") from None
    for name, layer in layers.items():
        replace(model, name, layer)
    with torch.no_grad():
        for name, value in saved["vectors"].items():
            params[name].copy_(value)
    record = QuantRecord(**{**saved["record"], "cached": True})
    return model, record
