"""Summaries of repeated measurements that skip missing (None) and non-finite values."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def cv(values: Sequence[float | None]) -> float | None:
    """Coefficient of variation (sample stdev / mean); None for fewer than two values."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return statistics.stdev(vals) / statistics.fmean(vals)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
