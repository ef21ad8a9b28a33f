"""Perplexity on the held-out text of quant/corpus.toml: exp of the mean next-token negative
log-likelihood over fixed, non-overlapping windows (every window scored from its own start)."""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from quant.calibration import TokenWindows


@torch.inference_mode()
def perplexity(model: torch.nn.Module, windows: TokenWindows, *, progress: bool = True) -> float:
    nll, count = 0.0, 0
    for i in tqdm(range(windows.ids.shape[0]), desc="perplexity", unit="window", disable=not progress):
        ids = windows.ids[i:i + 1]
        logits = model(ids).logits[0, :-1].float()
        nll += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
        count += ids.shape[1] - 1
    return math.exp(nll / count)
