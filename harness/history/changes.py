"""Change points in a history series: E-Divisive means with a two-sample test, as Apache Otava
(formerly Hunter) finds them, with a rank-sum test in place of Otava's t-test by default.

A series is one metric of one combination on one platform, oldest first. E-Divisive (Matteson and
James 2014) picks the split of a segment that maximizes the energy statistic q-hat, the divergence
between the values before and after it; Otava replaced its permutation test with a two-sample
t-test on the two sides, which is deterministic and far cheaper, and so does this module:

1. within each window of `window` points (windows overlap by half, so a step near a window's edge
   is inside the next one), split recursively at the best q-hat while the split's p-value is
   below `max_pvalue` and both sides have `min_size` points;
2. then every candidate is tested again against its neighbours (the segments between it and the
   change points beside it), and the weakest of those that no longer pass (p-value above
   `max_pvalue` or relative change below `min_magnitude`) is dropped, until all pass.

Three departures from Otava, each for a finding of the tests (tests/unit/test_history_changes.py)
or of benchmarks/changepoint_power.py (docs/history.md has its figures):
- the split q-hat picks is moved to the least-squares split within two points of it: with noise,
  q-hat put a 10% step one point early, and a step put one commit early blames the wrong commit;
- a split's p-value is multiplied by the number of splits it was chosen from (Bonferroni): the best
  of n splits has a p-value about n times too small, and a steady 12-point series showed a 4%
  "change" at p = 0.0003 without it;
- the test of a split (in the windows and in the final re-test) is the Mann-Whitney U (Wilcoxon
  rank-sum) test, normal approximation with tie and continuity corrections, as scipy computes it
  (`test="mannwhitney"`), in windows of 60: a few wild points (Student-t noise, a busy CI hour) pull
  the t-test's variance up and hide a step, and ranks do not see how wild they are; chosen among
  Welch and rank-sum tests in windows of 30 and 60 by a rule declared before the held-out series
  were scored (docs/history.md). `test="welch"` is Otava's t-test.

Fast enough for `history changes` over a large history (docs/history.md has the figures): q-hat
of every split comes from prefix sums of the distance matrix, the first split of all full windows
of a series is computed at once (_screen; the rank test ranks all its windows at once), and both
tests are scipy's arithmetic written out. Where rounding could decide a choice (two splits within
rounding of a tie, a p-value within 0.1% of max_pvalue), those figures are summed again term by
term as the definitions read, so the change points are the window-by-window, split-by-split loop's
(the tests keep that loop and compare).

Own code rather than MongoDB's signal-processing-algorithms (the library Hunter started from): a
C extension pinned to old numpy for about 60 lines of numpy here, and its permutation test is
random; the t-test variant is what Otava ships.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TESTS = ("welch", "mannwhitney")  # the two-sample test of a split: Welch's t-test, or the rank-sum test
TEST_NAMES = {"welch": "Welch's t-test", "mannwhitney": "the Mann-Whitney rank-sum test"}
TEST = "mannwhitney"
WINDOW = 60
MAX_PVALUE = 0.001
MIN_MAGNITUDE = 0.0
MIN_SIZE = 3  # points on each side of a split: a t-test needs a spread on both
REACH = 2  # the least-squares split is looked for within this many points of q-hat's

# Speed only (the splits are those of the definitions summed term by term; see _segment):
TIE = 1e-12           # per point, the share of a row's total within which two splits may tie
PVALUE_MARGIN = 1.001  # a batched p-value this close to max_pvalue is decided one by one
BATCH_CELLS = 2_000_000  # distance-matrix cells per batch of windows (16 MB)


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
    tau, q, d, total = _qhat_all(x[None, :], min_size)
    return _first_best(d[0], tau[_near_best(q, total, n)[0]])


def _qhat_all(rows: np.ndarray, min_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q-hat of every split of each row (a window of points) at once: (the splits, q-hat per row and
    split, the rows' distance matrices, each row's sum of distances). The three block sums of a
    split come from prefix sums over the rows of the distance matrix: of whole rows (the points
    before the split against all) and of the rows left of the diagonal (before against before)."""
    count, n = rows.shape
    d = rows[:, :, None] - rows[:, None, :]
    np.abs(d, out=d)
    upper, left = np.zeros((count, n + 1)), np.zeros((count, n + 1))
    upper[:, 1:] = np.einsum("wij->wi", d).cumsum(axis=1)  # d[:t, :].sum(); einsum: sums of short rows fast
    left[:, 1:] = 2.0 * np.einsum("wij,ij->wi", d, np.tri(n, k=-1)).cumsum(axis=1)  # d[:t, :t].sum()
    tau = np.arange(min_size, n - min_size + 1)
    m, k = tau.astype(float), (n - tau).astype(float)
    total, left, upper = upper[:, n], left[:, tau], upper[:, tau]
    right = total[:, None] - 2.0 * upper + left
    between = (upper - left) * 2.0 / (m * k)
    with np.errstate(divide="ignore", invalid="ignore"):
        within_left = np.where(m > 1, left / (m * (m - 1)), 0.0)
        within_right = np.where(k > 1, right / (k * (k - 1)), 0.0)
    return tau, (m * k / n) * (between - within_left - within_right), d, total


def _near_best(values: np.ndarray, scale: np.ndarray, n: int, *, lowest: bool = False) -> np.ndarray:
    """Per row, the entries within rounding of the row's highest (or lowest): the ones that may be
    the best when summed term by term. A prefix sum's rounding is below n x 2.2e-16 of the row's
    total (`scale`); TIE gives that a wide margin."""
    reach = TIE * n * scale[:, None]
    if lowest:
        return values <= values.min(axis=1, keepdims=True) + reach
    return values >= values.max(axis=1, keepdims=True) - reach


def _first_best(d: np.ndarray, candidates: np.ndarray) -> tuple[int, float]:
    """The candidate split with the highest q-hat summed term by term; the first of a tie."""
    best, where = -math.inf, -1
    for t in candidates.tolist():
        value = _qhat_at(d, t)
        if value > best:
            best, where = value, t
    return where, best


def _qhat_at(d: np.ndarray, tau: int) -> float:
    """q-hat of the split at tau of the points whose distance matrix is d, as its definition reads."""
    n = len(d)
    m, k = tau, n - tau
    between = d[:tau, tau:].sum() * 2.0 / (m * k)
    within_left = d[:tau, :tau].sum() / (m * (m - 1)) if m > 1 else 0.0
    within_right = d[tau:, tau:].sum() / (k * (k - 1)) if k > 1 else 0.0
    return (m * k / n) * (between - within_left - within_right)


def t_test(left: np.ndarray, right: np.ndarray) -> float:
    """The two-sided p-value of Welch's t-test between two segments (1.0 when neither spreads).

    scipy.stats.ttest_ind_from_stats(..., equal_var=False)'s arithmetic written out (the same
    figures), without its argument handling, which cost more than the rest of the detector."""
    sl, sr = left.std(ddof=1), right.std(ddof=1)
    if sl == 0 and sr == 0:
        return 0.0 if left.mean() != right.mean() else 1.0
    # sl * sl, not sl**2: scipy squares its std as an array (a product); a float's ** may differ in the last digit
    return float(_welch(left.mean(), sl * sl, len(left), right.mean(), sr * sr, len(right)))


def _welch(mean1: Any, var1: Any, n1: Any, mean2: Any, var2: Any, n2: Any) -> Any:
    """Welch's two-sided p-value from each side's mean, variance (ddof 1) and size; arrays or scalars."""
    from scipy.special import stdtr

    vn1, vn2 = var1 / n1, var2 / n2
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (vn1 + vn2)**2 / (vn1**2 / (n1 - 1) + vn2**2 / (n2 - 1))
        df = np.where(np.isnan(df), 1.0, df)
        t = (mean1 - mean2) / np.sqrt(vn1 + vn2)
    return 2 * stdtr(df, -np.abs(t))


def rank_test(left: np.ndarray, right: np.ndarray) -> float:
    """The two-sided p-value of the Mann-Whitney U (Wilcoxon rank-sum) test between two segments:
    the normal approximation with the tie and continuity corrections, scipy.stats.mannwhitneyu(left,
    right, method="asymptotic")'s figures (1.0 when all points are equal)."""
    return float(_mannwhitney(np.concatenate([left, right])[None, :], np.array([len(left)]))[0])


def _ranks(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ranks (1 to n; tied values share the mean of their ranks) and its tie term, the
    sum of t**3 - t over its groups of t equal values (the sum over its points of t * t - 1)."""
    count, n = rows.shape
    order = np.argsort(rows, axis=1, kind="stable")
    ordered = np.take_along_axis(rows, order, axis=1)
    starts = np.ones((count, n), dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends = np.ones((count, n), dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    at = np.arange(n)
    first = np.maximum.accumulate(np.where(starts, at, 0), axis=1)  # where each point's group begins
    last = np.minimum.accumulate(np.where(ends, at, n - 1)[:, ::-1], axis=1)[:, ::-1]  # and ends
    ranks = np.empty((count, n))
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=1)
    size = (last - first + 1).astype(float)
    return ranks, (size * size - 1.0).sum(axis=1)


def _mannwhitney(rows: np.ndarray, at: np.ndarray) -> np.ndarray:
    """rank_test of each row split at its `at` (arrays; scipy's asymptotic arithmetic written out).
    Ranks and tie terms are exact (halves and integers), so a row gives the same figure however it
    is batched."""
    from scipy.special import ndtr

    n = rows.shape[1]
    ranks, ties = _ranks(rows)
    m, k = at.astype(float), (n - at).astype(float)
    u1 = np.where(np.arange(n)[None, :] < at[:, None], ranks, 0.0).sum(axis=1) - m * (m + 1) / 2
    u = np.maximum(u1, m * k - u1)
    with np.errstate(divide="ignore", invalid="ignore"):  # all points equal: z = -inf, p = 1
        s = np.sqrt(m * k / 12 * ((n + 1) - ties / (n * (n - 1))))
        z = (u - m * k / 2 - 0.5) / s
    return np.clip(2 * ndtr(-z), 0.0, 1.0)


def _sse(x: np.ndarray, t: int) -> float:
    return float(((x[:t] - x[:t].mean()) ** 2).sum() + ((x[t:] - x[t:].mean()) ** 2).sum())


def _sse_all(rows: np.ndarray, splits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the sum of squares within the two sides of each row split at each of `splits`, each row's
    total): from prefix sums of the values less the row's mean, for all splits at once."""
    n = rows.shape[1]
    y = rows - rows.mean(axis=1, keepdims=True)
    p, sq = np.zeros((len(rows), n + 1)), np.zeros((len(rows), n + 1))
    p[:, 1:], sq[:, 1:] = y.cumsum(axis=1), (y * y).cumsum(axis=1)
    left = sq[:, splits] - p[:, splits] ** 2 / splits
    right = (sq[:, n:] - sq[:, splits]) - (p[:, n:] - p[:, splits]) ** 2 / (n - splits)
    return left + right, sq[:, n]


def _refined(x: np.ndarray, tau: int, min_size: int, reach: int = REACH) -> int:
    """The least-squares split (the smallest sum of squares within the two sides) near tau; of a tie
    the first. Those that may be smallest are summed again term by term (_sse)."""
    near = np.arange(max(min_size, tau - reach), min(len(x) - min_size, tau + reach) + 1)
    sse, total = _sse_all(x[None, :], near)
    return min(near[_near_best(sse, total, len(x), lowest=True)[0]].tolist(), key=lambda t: _sse(x, t))


def _pvalue(left: np.ndarray, right: np.ndarray, min_size: int, test: str) -> float:
    """The split's p-value (`test`: "welch" or "mannwhitney"), corrected for its choice among the
    segment's possible splits."""
    if min(len(left), len(right)) < 2:
        return 1.0  # too short to tell
    splits = max(len(left) + len(right) - 2 * min_size + 1, 1)
    return min(1.0, (rank_test if test == "mannwhitney" else t_test)(left, right) * splits)


def _split(x: np.ndarray, start: int, end: int, max_pvalue: float, min_size: int, test: str,
           found: set[int]) -> None:
    """Recursive binary segmentation of x[start:end] at the best q-hat while the split is significant."""
    tau, _ = qhat(x[start:end], min_size)
    if tau < 0:
        return
    at = start + _refined(x[start:end], tau, min_size)
    if _pvalue(x[start:at], x[at:end], min_size, test) >= max_pvalue:
        return
    found.add(at)
    _split(x, start, at, max_pvalue, min_size, test, found)
    _split(x, at, end, max_pvalue, min_size, test, found)


def _screen(rows: np.ndarray, max_pvalue: float, min_size: int, test: str) -> tuple[np.ndarray, np.ndarray]:
    """The first split of many windows of one length at once, as _split would make it: (each row's
    split, whether it is significant beyond doubt); a row whose split or p-value lies within
    rounding of a tie or of max_pvalue is neither significant nor clear and is left to _split."""
    n = rows.shape[1]
    tau, q, _, total = _qhat_all(rows, min_size)
    sure = _near_best(q, total, n).sum(axis=1) == 1
    best = tau[np.argmax(q, axis=1)]
    sse, squares = _sse_all(rows, tau)
    sse = np.where(np.abs(tau[None, :] - best[:, None]) <= REACH, sse, np.inf)
    sure &= _near_best(sse, squares, n, lowest=True).sum(axis=1) == 1
    at = tau[np.argmin(sse, axis=1)]
    p = _split_pvalues(rows, at, min_size, test)
    significant = sure & (p < max_pvalue / PVALUE_MARGIN)
    clear = sure & (p > max_pvalue * PVALUE_MARGIN)
    return at, np.where(significant, 1, np.where(clear, 0, -1))


def _split_pvalues(rows: np.ndarray, at: np.ndarray, min_size: int, test: str) -> np.ndarray:
    """_pvalue of each row split at its `at`, from masked sums; NaN where a side has one point or
    (Welch) both sides barely spread (t_test's no-spread case), decided one by one."""
    n = rows.shape[1]
    left = np.arange(n)[None, :] < at[:, None]
    m, k = at.astype(float), (n - at).astype(float)
    if test == "mannwhitney":
        p = np.minimum(1.0, _mannwhitney(rows, at) * max(n - 2 * min_size + 1, 1))
        return np.where(np.minimum(m, k) < 2, np.nan, p)
    mean_l, mean_r = np.where(left, rows, 0.0).sum(axis=1) / m, np.where(left, 0.0, rows).sum(axis=1) / k
    squares = (rows - np.where(left, mean_l[:, None], mean_r[:, None])) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):  # a side of one point: NaN, decided one by one
        var_l, var_r = np.where(left, squares, 0.0).sum(axis=1) / (m - 1), np.where(left, 0.0, squares).sum(axis=1) / (k - 1)
        p = np.minimum(1.0, _welch(mean_l, var_l, m, mean_r, var_r, k) * max(n - 2 * min_size + 1, 1))
        flat = (var_l / m + var_r / k <= 1e-10 * (mean_l**2 + mean_r**2)) | (np.minimum(m, k) < 2)
    return np.where(flat, np.nan, p)


def _windows(n: int, window: int, min_size: int) -> list[tuple[int, int]]:
    """(start, end) of each window: `window` points, overlapping by half, the last one cut short."""
    out = []
    for start in range(0, max(n - min_size, 1), max(window // 2, 1)):
        out.append((start, min(start + window, n)))
        if start + window >= n:
            break
    return out


def _segment(x: np.ndarray, window: int, max_pvalue: float, min_size: int, test: str) -> set[int]:
    """Every window split recursively (_split): the first split of all full-length windows screened
    together (_screen), the rest and the undecided one by one. The same splits as _split on each."""
    found: set[int] = set()
    spans = _windows(len(x), window, min_size)
    screened = [s for s, e in spans if e - s == window] if 1 <= min_size and 2 * min_size <= window else []
    per_batch = max(1, BATCH_CELLS // (window + 1) ** 2)
    for i in range(0, len(screened), per_batch):
        starts = np.asarray(screened[i:i + per_batch])
        at, verdict = _screen(x[starts[:, None] + np.arange(window)], max_pvalue, min_size, test)
        for start, split, v in zip(starts.tolist(), (starts + at).tolist(), verdict.tolist()):
            if v == 1:
                found.add(split)
                _split(x, start, split, max_pvalue, min_size, test, found)
                _split(x, split, start + window, max_pvalue, min_size, test, found)
            elif v == -1:
                _split(x, start, start + window, max_pvalue, min_size, test, found)
    done = set(screened)
    for start, end in spans:
        if start not in done:
            _split(x, start, end, max_pvalue, min_size, test, found)
    return found


def _tested(x: np.ndarray, points: list[int], min_size: int, test: str) -> list[ChangePoint]:
    """Each point against the segments between it and its neighbours."""
    edges = [0, *points, len(x)]
    out = []
    for i, at in enumerate(points, 1):
        left, right = x[edges[i - 1]:at], x[at:edges[i + 1]]
        out.append(ChangePoint(at, float(left.mean()), float(right.mean()), _pvalue(left, right, min_size, test)))
    return out


def change_points(values: Sequence[float], *, window: int = WINDOW, max_pvalue: float = MAX_PVALUE,
                  min_magnitude: float = MIN_MAGNITUDE, min_size: int = MIN_SIZE,
                  test: str = TEST) -> list[ChangePoint]:
    """The change points of a series, oldest first; `test` is the two-sample test of a split, in the
    windows and in the final re-test ("welch" or "mannwhitney", TESTS)."""
    if test not in TESTS:
        raise ValueError(f"test {test!r}: one of {', '.join(TESTS)}")
    x = np.asarray(values, dtype=float)
    points = sorted(_segment(x, window, max_pvalue, min_size, test))
    while points:
        tested = _tested(x, points, min_size, test)
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
