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

with warnings.catch_warnings():
    warnings.simplefilter("ignore", category=DeprecationWarning)  # torch.ao is deprecated, still shipped
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear


class PackedOnceLinear(DynamicLinear):
    """torch's dynamic int8 Linear without the prepack of an empty full-size weight that its
    constructor makes before `from_float` packs the real one (fbgemm packs about 60-120 MB/s on one
    thread: for the 0.5B draft's 494 MB a third of quantizing it, in every worker start). The real
    weight is packed by the same call as before, so the layer computes exactly the same."""

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, dtype: torch.dtype = torch.qint8) -> None:
        super().__init__(1, 1, bias_, dtype=dtype)  # a 1x1 placeholder, replaced by from_float's set_weight_bias
        self.in_features, self.out_features = in_features, out_features


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
