"""w8af32-tensor: int8 weights (per output channel), int8 activations quantized dynamically per
call with ONE scale per tensor, float32 everywhere else: torch's dynamic quantization
(torch.ao.quantization.quantize_dynamic, fbgemm's x86 int8 GEMM).

Kept beside `w8af32` (per-token scales) to measure the difference: here a block of K+1 verified
tokens quantizes differently from one token, so a *target* in this precision can disagree with
its own plain greedy output (measured on the 1.5B target). For a *draft* that only changes which tokens are
proposed, never the output.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from quant.layers import PackedOnceLinear


def quantize(model: torch.nn.Module, *, per_channel: bool = True, progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("w8af32 quantizes a float32 model; load it with dtype=torch.float32 first")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)  # torch.ao is deprecated, still shipped
        warnings.simplefilter("ignore", category=UserWarning)
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

        qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
        layers = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
        model = quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=torch.qint8,
                                 mapping={torch.nn.Linear: PackedOnceLinear}, inplace=True)
    return model, layers, {"per_channel": per_channel, "activations": "dynamic int8, per tensor"}
