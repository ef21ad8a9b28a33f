"""w4abf16-rtn: plain round-to-nearest 4-bit weights per group (asymmetric), bf16 activations,
torch's CPU int4 kernel. The reference AWQ has to beat."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from quant.layers import Int4WeightOnlyLinear, Int8WeightOnlyLinear, QuantSettingsError, check_int4_shape
from quant.walk import linear_layers, replace

HEADS = ("int8", "bf16")


def check_head(lm_head: str) -> None:
    if lm_head not in HEADS:
        raise QuantSettingsError(f"lm_head={lm_head!r}: choose {' or '.join(HEADS)}")


def quantize_head(model: torch.nn.Module, lm_head: str) -> str:
    """The output projection stays out of int4 (the usual AWQ practice: its errors land straight on
    the logits). In bf16 it is a quarter of the bytes a 1.5B Qwen reads per token, so by default
    it gets int8 weight-only (aten._weight_int8pack_mm) instead."""
    head = getattr(model, "lm_head", None)
    if lm_head == "int8" and type(head) is torch.nn.Linear:
        model.lm_head = Int8WeightOnlyLinear(head.weight, head.bias)
        return "int8 weight-only"
    return "unchanged"


def quantize(model: torch.nn.Module, *, group_size: int = 128, skip: tuple[str, ...] = ("lm_head",),
             lm_head: str = "int8", progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    check_head(lm_head)
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:  # every shape checked before any layer changes
        check_int4_shape(name, lin.weight, group_size)
    for name, lin in tqdm(layers, desc="int4 round-to-nearest", unit="layer", disable=not progress):
        replace(model, name, Int4WeightOnlyLinear(lin.weight, lin.bias, group_size=group_size, name=name))
    head = quantize_head(model, lm_head)
    return model, len(layers), {"group_size": group_size, "skip": list(skip), "lm_head": head}
