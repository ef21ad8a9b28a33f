"""w8af32: int8 weights per output channel, activations quantized to int8 per token at run time,
float32 everywhere else (quant.layers.Int8DynamicLinear, torch._int_mm).

Per-token scales make a row's result independent of the other rows in the call, so a block of
K+1 tokens verified together has no systematic effect on any of them. The per-tensor variant
(`w8af32-tensor`) lets the block's largest token set every row's step (its held-out
perplexity on long windows is far worse). Bit-equality with plain decoding is still not
guaranteed: a last-bit fp32 difference upstream can tip an int8 rounding (harness/accuracy/equivalence.py).
On this CPU torch._int_mm is 2-4x slower at one token than fbgemm's per-tensor kernel, so drafts,
whose exactness never reaches the output, use `w8af32-tensor`."""

from __future__ import annotations

from typing import Any

import torch

from quant.layers import Int8DynamicLinear
from quant.walk import convert_all


def quantize(model: torch.nn.Module, *, skip: tuple[str, ...] = (), progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    converted = convert_all(model, skip, lambda lin: Int8DynamicLinear(lin.weight, lin.bias))
    return model, converted, {"skip": list(skip), "weights": "int8 per output channel",
                             "activations": "dynamic int8, per token"}
