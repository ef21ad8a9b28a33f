"""w8af32: int8 weights per output channel, activations quantized to int8 per token at run time,
float32 everywhere else (quant.layers.Int8DynamicLinear, torch._int_mm).

Per-token scales make a row's result independent of the other rows in the call: a block of K+1
tokens verified together computes each token exactly as decoding it alone would, so a target in
this precision gives assisted output equal to its own plain output. The per-tensor variant
(`w8af32-tensor`) does not (FACTS.md)."""

from __future__ import annotations

from typing import Any

import torch

from quant.layers import Int8DynamicLinear
from quant.walk import linear_layers, replace


def quantize(model: torch.nn.Module, *, skip: tuple[str, ...] = (), progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:
        replace(model, name, Int8DynamicLinear(lin.weight, lin.bias))
    return model, len(layers), {"skip": list(skip), "weights": "int8 per output channel",
                                "activations": "dynamic int8, per token"}
