"""w8a8 (SmoothQuant): move activation outliers into the weights, then int8 weights per output
channel and int8 activations per token (quant.layers.Int8DynamicLinear).

Per input channel j (Xiao et al., 2023): s_j = max|X_j|^alpha / max|W_j|^(1 - alpha); the weight
column is multiplied by s_j and the activation divided by it, so the product is unchanged and
the activation's range is flatter. alpha = 0.5 is the paper's default; 0 is plain w8a8."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from quant.calibration import TokenWindows, collect_input_stats
from quant.layers import Int8DynamicLinear, QuantSettingsError
from quant.walk import linear_layers, replace


def smoothing_scale(weight: torch.Tensor, act_abs_max: torch.Tensor, alpha: float) -> torch.Tensor:
    w_max = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    return (act_abs_max.float().clamp(min=1e-5).pow(alpha) / w_max.pow(1 - alpha)).clamp(min=1e-5)


@torch.no_grad()
def quantize(model: torch.nn.Module, *, calibration: TokenWindows | None = None, alpha: float = 0.5,
             rows: int = 16, skip: tuple[str, ...] = (), progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    if calibration is None:
        raise QuantSettingsError("w8a8 (SmoothQuant) needs calibration text: pass calibration="
                                 "quant.calibration.token_windows(tokenizer) (models.load does)")
    if not 0.0 <= alpha <= 1.0:
        raise QuantSettingsError(f"alpha={alpha}: SmoothQuant's migration strength is between 0 and 1 (0.5 typical)")
    layers = linear_layers(model, tuple(skip))
    stats = collect_input_stats(model, calibration, [n for n, _ in layers], rows=rows, progress=progress)
    for name, lin in tqdm(layers, desc="SmoothQuant", unit="layer", disable=not progress):
        s = smoothing_scale(lin.weight, stats.pop(name).abs_max, alpha)
        replace(model, name, Int8DynamicLinear(lin.weight, lin.bias, input_scale=s))
    return model, len(layers), {"alpha": alpha, "skip": list(skip), "calibration": calibration.describe()}
