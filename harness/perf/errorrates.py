"""What both gates' statistics share: Student's t quantile and the Bonferroni split of an error
rate over several tests (metrics, combinations, looks at the data, directions).

Bonferroni is conservative and holds whatever the correlation between the tests: the stored gate
splits its alpha over its looks (perf/stored/stats.py), the A/B gate its family alpha over
directions, metrics, combinations and looks and its miss rate over looks (perf/ab/paired.py).
"""

from __future__ import annotations


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def split(rate: float, *counts: int) -> float:
    """`rate` shared equally over the product of `counts` tests (each at least 1)."""
    n = 1
    for c in counts:
        n *= max(1, c)
    return rate / n
