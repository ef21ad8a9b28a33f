"""What both gates' statistics share: Student's t quantile, the interval of a geometric mean, and the
Bonferroni split of an error
rate over several tests (metrics, combinations, looks at the data, directions).

Bonferroni is conservative and holds whatever the correlation between the tests: the stored gate
splits its alpha over its looks (perf/stored/stats.py), the A/B gate its family alpha over
directions, metrics, combinations and looks and its miss rate over looks (perf/ab/paired.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with `df` degrees of freedom: scipy.stats.t.ppf's value, from
    scipy.special, whose import takes a fraction of scipy.stats' (seconds of every gate's process:
    docs/ci.md, "How make test spends its time")."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def normal_quantile(p: float) -> float:
    """The p quantile of the standard normal (scipy.stats.norm.ppf's value, from scipy.special)."""
    from scipy.special import ndtri

    return float(ndtri(p))


def geometric_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The `level` interval of the geometric mean of positive `values` (Student's t on their logs);
    None with fewer than 2."""
    if len(values) < 2:
        return None
    logs = [math.log(v) for v in values]
    mean = statistics.fmean(logs)
    half = t_quantile(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def split(rate: float, *counts: int) -> float:
    """`rate` shared equally over the product of `counts` tests (each at least 1)."""
    n = 1
    for c in counts:
        n *= max(1, c)
    return rate / n
