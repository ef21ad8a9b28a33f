"""Change points in the run history (harness/history/changes.py): E-Divisive means with a rank-sum
test (Welch's t-test as Otava has it, on request) finds a planted step where it is, with its size and
direction, finds none in a steady noisy series, finds a step in heavy-tailed noise that the t-test
misses, and `history changes --since REV` fails CI only for a regression after REV."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.history import changes, store
from harness.history.store import Measurement, Run
from test_cli import cli
from test_history_store import origin


def noisy(level: float, n: int, seed: int, spread: float = 0.02) -> list[float]:
    return list(level * (1 + spread * np.random.default_rng(seed).standard_normal(n)))


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_planted_step_is_found_where_it_is_with_its_size_and_direction(seed):
    # 10% slower from point 25 on, 1% noise (at 2% a point 2.7 sd low just before the step belongs
    # to the slower side by the data themselves, and the step is found one point early)
    series = noisy(10.0, 25, seed, spread=0.01) + noisy(9.0, 25, seed + 100, spread=0.01)
    [c] = changes.change_points(series)
    assert c.index == 25 and c.magnitude == pytest.approx(-0.10, abs=0.01) and c.pvalue < 1e-6
    assert changes.is_regression("plain_tokens_per_sec", c) and not changes.is_regression("time_per_token_ms", c)


@pytest.mark.parametrize("test", changes.TESTS)
def test_two_steps_in_a_long_series_are_both_found_across_windows(test):
    series = noisy(10.0, 40, 3) + noisy(11.0, 40, 4) + noisy(9.5, 40, 5)
    found = changes.change_points(series, window=30, test=test)
    assert [c.index for c in found] == [40, 80]
    assert [round(c.magnitude, 2) for c in found] == pytest.approx([0.10, -0.14], abs=0.015)


def t3_step(seed: int) -> np.ndarray:
    """30 points at 10, then 30 at 9.5 (a 5% step), noise 2% x Student-t(3) (sd 3.46%)."""
    rng = np.random.default_rng([29, seed])
    return 10.0 * np.r_[np.ones(30), np.full(30, 0.95)] * (1 + 0.02 * rng.standard_t(3, 60))


def found_at_step(series: np.ndarray, **settings) -> bool:
    return any(abs(c.index - 30) <= 2 for c in changes.change_points(series, **settings))


@pytest.mark.parametrize("seed", [7, 11, 44, 53])
def test_a_step_in_heavy_tailed_noise_that_welchs_t_test_misses_is_found_by_the_rank_test(seed):
    """A few wild points pull the t-test's variance up (Student-t noise, busy CI hours); ranks do
    not see how wild they are. These seeds' steps Welch misses in a window of 30 (the old defaults)
    and of 60; the defaults (rank-sum test, window 60) find them where they are."""
    series = t3_step(seed)
    assert (changes.TEST, changes.WINDOW) == ("mannwhitney", 60)
    assert not found_at_step(series, test="welch", window=30) and not found_at_step(series, test="welch", window=60)
    [c] = changes.change_points(series)
    assert abs(c.index - 30) <= 1 and c.magnitude < 0 and c.pvalue < changes.MAX_PVALUE


def test_the_rank_test_finds_most_heavy_tailed_steps_and_welch_fewer():
    """Of 60 such steps the defaults find 53 where they are, Welch's t-test 48 in the same window and
    26 in the old one (30 points)."""
    hits = {test: sum(found_at_step(t3_step(seed), test=test) for seed in range(60)) for test in changes.TESTS}
    welch_old = sum(found_at_step(t3_step(seed), test="welch", window=30) for seed in range(60))
    assert hits["mannwhitney"] >= 50 and hits["welch"] < hits["mannwhitney"] and welch_old <= 32, (hits, welch_old)


def busy_flat(seed: int, n: int = 200) -> np.ndarray:
    """A flat series in heavy-tailed noise (2% x Student-t(3)) with busy hours: 5% of the points
    10-30% slow, scattered."""
    rng = np.random.default_rng([31, seed])
    x = 10.0 * (1 + 0.02 * rng.standard_t(3, n))
    busy = rng.random(n) < 0.05
    x[busy] *= 1 - rng.uniform(0.1, 0.3, int(busy.sum()))
    return x


@pytest.mark.parametrize("seed", [*range(12), 106])
def test_a_flat_heavy_tailed_series_has_no_change_point(seed):
    """Seed 106: Welch's t-test (window 30) puts a false change point in it; the rank test does not."""
    assert changes.change_points(busy_flat(seed)) == []
    if seed == 106:
        assert len(changes.change_points(busy_flat(seed), test="welch", window=30)) == 1


def test_an_unknown_test_is_refused():
    with pytest.raises(ValueError, match="test 'ttest': one of welch, mannwhitney"):
        changes.change_points([1.0] * 10, test="ttest")


BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "changepoint_power.py"


@pytest.mark.parametrize("option", [["--test", "welch"], ["--window", "30"], ["--max-pvalue", "0.01"]])
def test_the_benchmark_refuses_other_settings_on_the_scored_seeds(option):
    r = subprocess.run([sys.executable, str(BENCHMARK), *option, "--series", "1", "--timing-runs", "0",
                        "--out", "/dev/null"], capture_output=True, text=True, cwd=BENCHMARK.parents[1])
    assert r.returncode != 0 and "explored on held-out seeds only: --seed-offset 100000" in r.stderr, r.stderr


@pytest.mark.parametrize("seed", range(6))
def test_a_steady_noisy_series_has_no_change_point(seed):
    assert changes.change_points(noisy(10.0, 120, seed, spread=0.05)) == []


def test_a_step_below_the_minimum_magnitude_is_dropped():
    series = noisy(10.0, 20, 6, spread=0.001) + noisy(9.9, 20, 7, spread=0.001)  # 1%, far above the noise
    assert [c.index for c in changes.change_points(series)] == [20]
    assert changes.change_points(series, min_magnitude=0.02) == []


def _git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_changes_since_a_revision_fails_only_for_a_regression_after_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shas = []
    for name in ("old", "new"):
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", name)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    history = tmp_path / "history.sqlite"
    values = noisy(10.0, 12, 8) + noisy(9.0, 12, 9)  # the new commit is 10% slower
    with store.open_store(history) as s:
        for i, v in enumerate(values):
            commit = shas[0] if i < 12 else shas[1]
            s.append(Run("bench", origin(commit, f"2026-11-{1 + i:02d}T10:00:00+00:00"),
                         (Measurement("bench:p", "tokens_per_sec", v, None, None, 8, None),)))
    r = cli("history", "changes", "--history", str(history), "--since", shas[0], cwd=repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"REGRESSION +(9\.9|10\.\d)\d* -> (8\.9|9\.\d)\d* \(-(9|10|11)\.\d%, p ", r.stdout), r.stdout
    assert f"between {shas[0][:12]}" in r.stdout and f"and {shas[1][:12]}" in r.stdout and "[after --since]" in r.stdout
    assert "1 regression(s) after" in r.stdout and "1 change point(s) in 1 series" in r.stdout
    ok = cli("history", "changes", "--history", str(history), "--since", shas[1], cwd=repo)
    assert ok.returncode == 0 and "0 regression(s) after" in ok.stdout, ok.stdout + ok.stderr
    bad = cli("history", "changes", "--history", str(history), "--since", "nosuchrev", cwd=repo)
    assert bad.returncode == 2 and "--since nosuchrev: not a revision of this repository" in bad.stderr


@pytest.mark.parametrize("seed", [21, 103, 297])
def test_the_split_is_moved_to_the_least_squares_step_where_q_hat_is_one_point_off(seed):
    """Seeds where q-hat alone puts a 10% step (3% noise) a point off and the least squares do not."""
    series = noisy(10.0, 20, seed, spread=0.03) + noisy(9.0, 20, seed + 1000, spread=0.03)
    tau, _ = changes.qhat(np.asarray(series))
    assert tau != 20  # the case this test is for
    assert [c.index for c in changes.change_points(series)] == [20]


def reference_qhat(x: np.ndarray, min_size: int = changes.MIN_SIZE) -> tuple[int, float]:
    """q-hat as its definition reads, split by split (the loop changes.qhat replaced)."""
    n = len(x)
    if n < 2 * min_size:
        return -1, 0.0
    d = np.abs(x[:, None] - x[None, :])
    best, where = -np.inf, -1
    for tau in range(min_size, n - min_size + 1):
        m, k = tau, n - tau
        between = d[:tau, tau:].sum() * 2.0 / (m * k)
        within_left = d[:tau, :tau].sum() / (m * (m - 1)) if m > 1 else 0.0
        within_right = d[tau:, tau:].sum() / (k * (k - 1)) if k > 1 else 0.0
        q = (m * k / n) * (between - within_left - within_right)
        if q > best:
            best, where = q, tau
    return where, best


def reference_t_test(left: np.ndarray, right: np.ndarray) -> float:
    from scipy.stats import ttest_ind_from_stats

    sl, sr = left.std(ddof=1), right.std(ddof=1)
    if sl == 0 and sr == 0:
        return 0.0 if left.mean() != right.mean() else 1.0
    return float(ttest_ind_from_stats(left.mean(), sl, len(left), right.mean(), sr, len(right),
                                      equal_var=False).pvalue)


def random_inputs(count: int):
    """Series of 1-200 points: steps, heavy tails, ties (rounded values), constant stretches."""
    rng = np.random.default_rng(2029)
    for i in range(count):
        n = int(rng.integers(1, 200))
        x = 10.0 + rng.standard_t(3, n) * rng.choice([0.01, 0.2, 3.0])
        x[int(rng.integers(0, n)):] *= rng.choice([1.0, 0.95, 1.3])
        if i % 4 == 1:
            x = np.round(x, 1)  # many ties
        elif i % 4 == 2:
            x[: n // 2] = x[0]  # a constant stretch
        yield x, int(rng.choice([1, 2, 3, 5]))


def test_the_fast_q_hat_equals_the_split_by_split_definition_on_random_inputs():
    for x, min_size in random_inputs(400):
        assert changes.qhat(x, min_size) == reference_qhat(x, min_size), (list(x), min_size)
    for x in (np.full(12, 3.0), np.arange(10.0), np.array([1.0, 2.0] * 8)):  # ties everywhere
        assert changes.qhat(x) == reference_qhat(x)


def test_the_written_out_welch_t_test_equals_scipys():
    for x, _ in random_inputs(300):
        at = len(x) // 2
        left, right = x[:at], x[at:]
        if min(len(left), len(right)) >= 2:
            assert changes.t_test(left, right) == pytest.approx(reference_t_test(left, right), rel=1e-12, abs=1e-300)


def reference_rank_test(left: np.ndarray, right: np.ndarray) -> float:
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(left, right, use_continuity=True, alternative="two-sided", method="asymptotic").pvalue)


def test_the_written_out_rank_test_equals_scipys_mann_whitney_u():
    """Ties (rounded values, constant stretches) included: the tie correction is scipy's."""
    rng = np.random.default_rng(7)
    checked = 0
    for x, _ in random_inputs(300):
        for at in {len(x) // 2, int(rng.integers(1, max(len(x), 2)))}:
            left, right = x[:at], x[at:]
            if min(len(left), len(right)) >= 1:
                assert changes.rank_test(left, right) == pytest.approx(reference_rank_test(left, right), rel=1e-12,
                                                                       abs=1e-300), (list(left), list(right))
                checked += 1
    assert checked > 400
    assert changes.rank_test(np.full(5, 2.0), np.full(4, 2.0)) == 1.0  # nothing to rank apart
    assert changes.rank_test(np.array([1.0, 1, 2, 2, 2]), np.array([2.0, 3, 3, 3])) == \
        pytest.approx(reference_rank_test(np.array([1.0, 1, 2, 2, 2]), np.array([2.0, 3, 3, 3])), rel=1e-12)


def reference_change_points(values, window=changes.WINDOW, max_pvalue=changes.MAX_PVALUE,
                            min_magnitude=changes.MIN_MAGNITUDE, min_size=changes.MIN_SIZE, test=changes.TEST):
    """The detector as its docstring reads, window by window and split by split (what changes.py
    computed before its windows were screened together and its sums taken from prefix sums), with
    scipy's test of each split (ttest_ind_from_stats or mannwhitneyu, asymptotic)."""
    x = np.asarray(values, dtype=float)
    two_sample = {"welch": reference_t_test, "mannwhitney": reference_rank_test}[test]

    def pvalue(left, right):
        if min(len(left), len(right)) < 2:
            return 1.0
        return min(1.0, two_sample(left, right) * max(len(left) + len(right) - 2 * min_size + 1, 1))

    def sse(y, t):
        return float(((y[:t] - y[:t].mean()) ** 2).sum() + ((y[t:] - y[t:].mean()) ** 2).sum())

    def split(start, end, found):
        tau, _ = reference_qhat(x[start:end], min_size)
        if tau < 0:
            return
        near = range(max(min_size, tau - 2), min(end - start - min_size, tau + 2) + 1)
        at = start + min(near, key=lambda t: sse(x[start:end], t))
        if pvalue(x[start:at], x[at:end]) < max_pvalue:
            found.add(at)
            split(start, at, found)
            split(at, end, found)

    found = set()
    for start in range(0, max(len(x) - min_size, 1), max(window // 2, 1)):
        split(start, min(start + window, len(x)), found)
        if start + window >= len(x):
            break
    points = sorted(found)
    while points:
        edges = [0, *points, len(x)]
        tested = [changes.ChangePoint(at, float(x[edges[i - 1]:at].mean()), float(x[at:edges[i + 1]].mean()),
                                      pvalue(x[edges[i - 1]:at], x[at:edges[i + 1]]))
                  for i, at in enumerate(points, 1)]
        weak = [c for c in tested if c.pvalue >= max_pvalue or abs(c.magnitude) < min_magnitude]
        if not weak:
            return tested
        points.remove(max(weak, key=lambda c: (c.pvalue, -abs(c.magnitude))).index)
    return []


def stepped_series(count: int):
    """Series of 10-400 points with 0-4 steps of 1-20%, Gaussian or Student-t noise of 0.1-5%; some
    rounded (ties), some with a constant stretch."""
    rng = np.random.default_rng(29)
    for i in range(count):
        n = int(rng.integers(10, 400))
        level = np.full(n, 10.0)
        for at in rng.integers(0, n, size=int(rng.integers(0, 5))):
            level[at:] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.01, 0.2)
        e = rng.standard_normal(n) if i % 2 else rng.standard_t(3, n)
        x = level * (1 + rng.choice([0.001, 0.01, 0.02, 0.05]) * e)
        if i % 7 == 3:
            x = np.round(x, 1)
        elif i % 7 == 5:
            x[n // 3: n // 2] = x[n // 3]
        yield x


@pytest.mark.parametrize("test", changes.TESTS)
@pytest.mark.parametrize("window,min_size", [(60, 3), (30, 3), (12, 3), (45, 2), (6, 3), (20, 1), (200, 3)])
def test_the_detector_finds_what_the_window_by_window_definition_finds(window, min_size, test, monkeypatch):
    """The screened windows, prefix sums and written-out tests change no change point, p-value aside
    in its last digits; a small batch size makes the windows come in several batches. (The rank test
    can pass no split of a window under 30 points at p 0.001 with the Bonferroni factor: 0.1 there.)"""
    monkeypatch.setattr(changes, "BATCH_CELLS", 3000)
    series = list(stepped_series(60)) + [x for x, _ in random_inputs(40)]
    settings = {"window": window, "min_size": min_size, "test": test,
                "max_pvalue": 0.1 if test == "mannwhitney" and window < 30 else changes.MAX_PVALUE}
    checked = 0
    for x in series:
        fast = changes.change_points(x, **settings)
        slow = reference_change_points(x, **settings)
        assert [(c.index, c.mean_before, c.mean_after) for c in fast] == \
               [(c.index, c.mean_before, c.mean_after) for c in slow], list(x)
        assert [c.pvalue for c in fast] == pytest.approx([c.pvalue for c in slow], rel=1e-9, abs=1e-300)
        checked += len(slow)
    assert checked > 10  # the series hold steps to find
