"""The gate's statistics on synthetic samples with a known truth: error rates by simulation."""

from __future__ import annotations

import math
import random

import pytest

from harness import stats


def lognormal(rng: random.Random, n: int, median: float, cv: float) -> list[float]:
    sigma = math.sqrt(math.log(1 + cv * cv))
    return [median * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def run_sequential(rng, slowdown: float, cv: float, tolerance: float, n0=8, batch=8, cap=32) -> stats.GateDecision:
    looks = 1 + -(-(cap - n0) // batch)
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, looks)
    baseline = lognormal(rng, cap, 10.0, cv)
    measured = lognormal(rng, n0, 10.0 * (1 - slowdown), cv)
    while True:
        d = stats.compare_samples("tokens_per_sec", baseline, measured, tolerance, alpha=alpha,
                                  at_cap=len(measured) >= cap)
        if d.verdict != stats.INCONCLUSIVE:
            return d
        measured += lognormal(rng, batch, 10.0 * (1 - slowdown), cv)


@pytest.mark.parametrize("cv", [0.03, 0.09])
def test_error_rates_at_the_calibrated_tolerance(cv):
    """Unchanged code fails at most ~1%; a slowdown of the full tolerance fails at least 95%."""
    rng = random.Random(1234)
    tolerance = stats.calibrated_tolerance(lognormal(rng, 32, 10.0, cv), cap=32,
                                           alpha=stats.alpha_per_look(stats.DEFAULT_ALPHA, 4))
    trials = 400
    false_alarms = sum(run_sequential(rng, 0.0, cv, tolerance).verdict == stats.FAIL for _ in range(trials))
    detected = sum(run_sequential(rng, tolerance, cv, tolerance).verdict == stats.FAIL for _ in range(trials))
    assert false_alarms / trials <= 0.015
    assert detected / trials >= 0.95


def test_clear_cases_and_the_message():
    rng = random.Random(7)
    base = lognormal(rng, 20, 10.0, 0.02)
    same = stats.compare_samples("speedup", base, lognormal(rng, 20, 10.0, 0.02), 0.10)
    assert same.verdict == stats.PASS and not same.decided_at_cap
    slow = stats.compare_samples("speedup", base, lognormal(rng, 20, 7.0, 0.02), 0.10)
    assert slow.verdict == stats.FAIL
    text = slow.describe()
    for part in ("speedup: baseline median", "measured median", "-29.9%", "tolerance 10%", "Welch t =", "n = 20"):
        assert part in text


def test_noise_gives_inconclusive_then_a_labelled_verdict_at_the_cap():
    rng = random.Random(3)
    base, meas = lognormal(rng, 4, 10.0, 0.3), lognormal(rng, 4, 9.6, 0.3)
    d = stats.compare_samples("tokens_per_sec", base, meas, 0.10)
    assert d.verdict == stats.INCONCLUSIVE
    capped = stats.compare_samples("tokens_per_sec", base, meas, 0.10, at_cap=True)
    assert capped.verdict in (stats.PASS, stats.FAIL) and capped.decided_at_cap
    assert "decided by the point estimate at the sample cap" in capped.describe()


def test_calibrated_tolerance_grows_with_noise():
    rng = random.Random(5)
    quiet = stats.calibrated_tolerance(lognormal(rng, 32, 10.0, 0.02), cap=32)
    noisy = stats.calibrated_tolerance(lognormal(rng, 32, 10.0, 0.2), cap=32)
    assert quiet == 0.05  # the floor
    assert noisy > 0.15


def test_bad_inputs():
    with pytest.raises(ValueError, match="tolerance must be within"):
        stats.compare_samples("x", [1, 2], [1, 2], 1.5)
    with pytest.raises(ValueError, match="at least 2 positive samples"):
        stats.compare_samples("x", [1.0], [1.0, 2.0], 0.1)


def test_exact_counters():
    base = {"p0": {"accepted": 5, "drafted": 6, "target_forwards": 3, "new_tokens": 8}}
    assert stats.compare_exact(base, base).verdict == stats.PASS
    changed = {"p0": {**base["p0"], "accepted": 4}}
    d = stats.compare_exact(base, changed)
    assert d.verdict == stats.FAIL and "p0 accepted: baseline 5, measured 4" in d.describe()
    assert "p1: measured, not in the baseline" in stats.compare_exact(base, {**base, "p1": base["p0"]}).describe()
