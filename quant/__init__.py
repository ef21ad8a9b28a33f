"""Weight quantization: one module per method behind one small interface.

    model, record = quantize(model, "w8af32", **settings)

`record` says what was done (method, settings, layers converted, time) and goes into results.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# method name -> (module, float dtype the model is loaded in before quantizing)
_METHODS: dict[str, tuple[str, str]] = {
    "w8af32": ("quant.w8af32", "float32"),
}


@dataclass
class QuantRecord:
    method: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def methods() -> tuple[str, ...]:
    return tuple(_METHODS)


def base_dtype(method: str) -> str:
    """The float dtype (torch attribute name) a model is loaded in before `quantize`."""
    return _METHODS[_check(method)][1]


def _check(method: str) -> str:
    if method not in _METHODS:
        raise ValueError(f"unknown quantization method {method!r}; available: {', '.join(_METHODS)}")
    return method


def quantize(model: Any, method: str, **settings: Any) -> tuple[Any, QuantRecord]:
    module = importlib.import_module(_METHODS[_check(method)][0])
    start = time.perf_counter()
    model, layers, used = module.quantize(model, **settings)
    return model, QuantRecord(method=method, settings=used, layers=layers, seconds=time.perf_counter() - start)
