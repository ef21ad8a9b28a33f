"""w4abf16-rtn: plain round-to-nearest 4-bit weights per group (asymmetric), bf16 activations,
torch's CPU int4 kernel. The reference AWQ has to beat."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from quant.layers import Int4WeightOnlyLinear, check_int4_shape
from quant.walk import linear_layers, replace


def quantize(model: torch.nn.Module, *, group_size: int = 128, skip: tuple[str, ...] = ("lm_head",),
             progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:  # every shape checked before any layer changes
        check_int4_shape(name, lin.weight, group_size)
    for name, lin in tqdm(layers, desc="int4 round-to-nearest", unit="layer", disable=not progress):
        replace(model, name, Int4WeightOnlyLinear(lin.weight, lin.bias, group_size=group_size, name=name))
    return model, len(layers), {"group_size": group_size, "skip": list(skip)}
