"""w8abf16: int8 weight-only (per output channel), bf16 activations and compute
(quant.layers.Int8WeightOnlyLinear, aten._weight_int8pack_mm)."""

from __future__ import annotations

from typing import Any

import torch

from quant.layers import Int8WeightOnlyLinear
from quant.walk import convert_all


def quantize(model: torch.nn.Module, *, skip: tuple[str, ...] = (), progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    converted = convert_all(model, skip, lambda lin: Int8WeightOnlyLinear(lin.weight, lin.bias))
    return model, converted, {"skip": list(skip), "weights": "int8 per output channel",
                             "activations": "bf16"}
