"""w4abf16 (AWQ): activation-aware weight quantization to 4 bits per group, bf16 activations.

Per linear layer (Lin et al., 2023): channels that see large activations matter more, so scale
input channel j of the weight up by s_j = mean|x_j|^alpha before rounding and divide the
activation by s_j at run time (the layer's `input_scale`). alpha is searched on a grid in
[0, 1] to minimise the layer's output error on calibration rows; alpha = 0 is plain
round-to-nearest, so the chosen scale never does worse than RTN on the calibration data.

Simplifications against the paper, stated: the search is per layer on the float model's
inputs (the paper searches per block and folds 1/s into the preceding norm or linear; here the
division stays in the layer, one multiply per activation), and there is no weight-clipping
search."""

from __future__ import annotations

import logging
from typing import Any

import torch
from tqdm.auto import tqdm

from quant.calibration import TokenWindows, collect_input_stats
from quant.layers import Int4WeightOnlyLinear, QuantSettingsError, check_int4_shape, int4_fake_quant
from quant.rtn import check_head, quantize_head
from quant.walk import linear_layers, replace

log = logging.getLogger(__name__)


def search_scale(weight: torch.Tensor, x: torch.Tensor, abs_mean: torch.Tensor, group_size: int,
                 grid: int) -> tuple[torch.Tensor, float, float, float]:
    """Best per-input-channel scale for one layer: (scale, alpha, awq loss, rtn loss)."""
    w = weight.detach().float()
    x = x.float()
    ref = x @ w.t()
    best: tuple[float, float, torch.Tensor] | None = None
    rtn_loss = float("nan")
    for i in range(grid + 1):
        alpha = i / grid
        s = abs_mean.float().clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        out = (x / s) @ int4_fake_quant(w * s, group_size).t()
        loss = (out - ref).pow(2).mean().item()
        if i == 0:
            rtn_loss = loss
        if best is None or loss < best[0]:
            best = (loss, alpha, s)
    assert best is not None
    return best[2], best[1], best[0], rtn_loss


@torch.no_grad()
def quantize(model: torch.nn.Module, *, calibration: TokenWindows | None = None, group_size: int = 128,
             grid: int = 20, rows: int = 256, skip: tuple[str, ...] = ("lm_head",), lm_head: str = "int8",
             progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    if calibration is None:
        raise QuantSettingsError("w4abf16 (AWQ) needs calibration text: pass calibration="
                                 "quant.calibration.token_windows(tokenizer) (models.load does)")
    check_head(lm_head)
    if not 1 <= grid <= 100:
        raise QuantSettingsError(f"grid={grid}: give 1-100 alpha steps (AWQ uses 20)")
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:
        check_int4_shape(name, lin.weight, group_size)
    stats = collect_input_stats(model, calibration, [n for n, _ in layers], rows=rows, progress=progress)
    alphas, gains = [], []
    for name, lin in tqdm(layers, desc="AWQ scale search", unit="layer", disable=not progress):
        st = stats.pop(name)
        scale, alpha, loss, rtn = search_scale(lin.weight, st.sample, st.abs_mean, group_size, grid)
        alphas.append(alpha)
        gains.append(loss / rtn if rtn > 0 else 1.0)
        replace(model, name, Int4WeightOnlyLinear(lin.weight, lin.bias, group_size=group_size,
                                                  input_scale=scale.to(lin.weight.dtype), name=name))
    details = {"lm_head": quantize_head(model, lm_head), "mean_alpha": sum(alphas) / len(alphas),
               "mean_loss_vs_rtn": sum(gains) / len(gains)}
    log.info("AWQ: %d layers, mean alpha %.2f, calibration loss %.2fx of round-to-nearest",
             len(layers), details["mean_alpha"], details["mean_loss_vs_rtn"])
    return model, len(layers), {"group_size": group_size, "grid": grid, "rows": rows, "skip": list(skip),
                                "calibration": calibration.describe(), **details}
