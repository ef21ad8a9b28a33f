"""Change points in a history series: E-Divisive means with a Student's t-test, as Apache Otava
(formerly Hunter) finds them.

A series is one metric of one combination on one platform, oldest first. E-Divisive (Matteson and
James 2014) picks the split of a segment that maximizes the energy statistic q-hat, the divergence
between the values before and after it; Otava replaced its permutation test with a two-sample
t-test on the two sides, which is deterministic and far cheaper, and so does this module:

1. within each window of `window` points (windows overlap by half, so a step near a window's edge
   is inside the next one), split recursively at the best q-hat while the split's t-test p-value is
   below `max_pvalue` and both sides have `min_size` points;
2. then every candidate is tested again against its neighbours (the segments between it and the
   change points beside it), and the weakest of those that no longer pass (p-value above
   `max_pvalue` or relative change below `min_magnitude`) is dropped, until all pass.

Two departures from Otava, each for a finding of the tests (tests/unit/test_history_changes.py):
- the split q-hat picks is moved to the least-squares split within two points of it: with noise,
  q-hat put a 10% step one point early, and a step put one commit early blames the wrong commit;
- a split's p-value is multiplied by the number of splits it was chosen from (Bonferroni): the best
  of n splits has a t-test p-value about n times too small, and a steady 12-point series showed a
  4% "change" at p = 0.0003 without it.

Own code rather than MongoDB's signal-processing-algorithms (the library Hunter started from): a
C extension pinned to old numpy for about 60 lines of numpy here, and its permutation test is
random; the t-test variant is what Otava ships.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 30
MAX_PVALUE = 0.001
MIN_MAGNITUDE = 0.0
MIN_SIZE = 3  # points on each side of a split: a t-test needs a spread on both


@dataclass(frozen=True)
class ChangePoint:
    index: int          # the first point after the change
    mean_before: float
    mean_after: float
    pvalue: float

    @property
    def magnitude(self) -> float:
        """The relative change of the mean, after / before - 1."""
        return self.mean_after / self.mean_before - 1.0 if self.mean_before else math.inf


def qhat(x: np.ndarray, min_size: int = MIN_SIZE) -> tuple[int, float]:
    """(the split index that maximizes E-Divisive's q-hat, its value); (-1, 0) if none fits."""
    n = len(x)
    if n < 2 * min_size:
        return -1, 0.0
    d = np.abs(x[:, None] - x[None, :])
    best, where = -math.inf, -1
    for tau in range(min_size, n - min_size + 1):
        m, k = tau, n - tau
        between = d[:tau, tau:].sum() * 2.0 / (m * k)
        within_left = d[:tau, :tau].sum() / (m * (m - 1)) if m > 1 else 0.0
        within_right = d[tau:, tau:].sum() / (k * (k - 1)) if k > 1 else 0.0
        q = (m * k / n) * (between - within_left - within_right)
        if q > best:
            best, where = q, tau
    return where, best


def t_test(left: np.ndarray, right: np.ndarray) -> float:
    """The two-sided p-value of Welch's t-test between two segments (1.0 when neither spreads)."""
    from scipy.stats import ttest_ind_from_stats

    sl, sr = left.std(ddof=1), right.std(ddof=1)
    if sl == 0 and sr == 0:
        return 0.0 if left.mean() != right.mean() else 1.0
    result = ttest_ind_from_stats(left.mean(), sl, len(left), right.mean(), sr, len(right), equal_var=False)
    return float(result.pvalue)


def _refined(x: np.ndarray, tau: int, min_size: int, reach: int = 2) -> int:
    """The least-squares split (the smallest sum of squares within the two sides) near tau."""
    def sse(t: int) -> float:
        return float(((x[:t] - x[:t].mean()) ** 2).sum() + ((x[t:] - x[t:].mean()) ** 2).sum())

    near = range(max(min_size, tau - reach), min(len(x) - min_size, tau + reach) + 1)
    return min(near, key=sse)


def _pvalue(left: np.ndarray, right: np.ndarray, min_size: int) -> float:
    """The split's t-test p-value, corrected for its choice among the segment's possible splits."""
    if min(len(left), len(right)) < 2:
        return 1.0  # too short to tell
    splits = max(len(left) + len(right) - 2 * min_size + 1, 1)
    return min(1.0, t_test(left, right) * splits)


def _split(x: np.ndarray, start: int, end: int, max_pvalue: float, min_size: int, found: set[int]) -> None:
    """Recursive binary segmentation of x[start:end] at the best q-hat while the split is significant."""
    tau, _ = qhat(x[start:end], min_size)
    if tau < 0:
        return
    at = start + _refined(x[start:end], tau, min_size)
    if _pvalue(x[start:at], x[at:end], min_size) >= max_pvalue:
        return
    found.add(at)
    _split(x, start, at, max_pvalue, min_size, found)
    _split(x, at, end, max_pvalue, min_size, found)


def _tested(x: np.ndarray, points: list[int], min_size: int) -> list[ChangePoint]:
    """Each point against the segments between it and its neighbours."""
    edges = [0, *points, len(x)]
    out = []
    for i, at in enumerate(points, 1):
        left, right = x[edges[i - 1]:at], x[at:edges[i + 1]]
        out.append(ChangePoint(at, float(left.mean()), float(right.mean()), _pvalue(left, right, min_size)))
    return out


def change_points(values: Sequence[float], *, window: int = WINDOW, max_pvalue: float = MAX_PVALUE,
                  min_magnitude: float = MIN_MAGNITUDE, min_size: int = MIN_SIZE) -> list[ChangePoint]:
    """The change points of a series, oldest first."""
    x = np.asarray(values, dtype=float)
    found: set[int] = set()
    step = max(window // 2, 1)
    for start in range(0, max(len(x) - min_size, 1), step):
        _split(x, start, min(start + window, len(x)), max_pvalue, min_size, found)
        if start + window >= len(x):
            break
    points = sorted(found)
    while points:
        tested = _tested(x, points, min_size)
        weak = [c for c in tested if c.pvalue >= max_pvalue or abs(c.magnitude) < min_magnitude]
        if not weak:
            return tested
        points.remove(max(weak, key=lambda c: (c.pvalue, -abs(c.magnitude))).index)
    return []


LOWER_IS_BETTER_SUFFIXES = ("_ms", "_s", "_seconds")


def is_regression(metric: str, change: ChangePoint) -> bool:
    """Whether the change made the metric worse: lower for rates, speedups and acceptance; higher
    for times."""
    worse_if_higher = metric.endswith(LOWER_IS_BETTER_SUFFIXES)
    return change.mean_after > change.mean_before if worse_if_higher else change.mean_after < change.mean_before
