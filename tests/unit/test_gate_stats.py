"""The gate's statistics on synthetic samples with a known truth: error rates by simulation."""

from __future__ import annotations

import math
import random

import pytest

from harness.perf.stored import stats
from harness.perf.outcome import Outcome


def lognormal(rng: random.Random, n: int, median: float, cv: float) -> list[float]:
    sigma = math.sqrt(math.log(1 + cv * cv))
    return [median * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


BLOCK = 4  # harness/matrix.toml [perf] drift_block


def session(rng, n: int, median: float, cv: float, drift: float = 0.0, block: int = BLOCK) -> list[float]:
    """n rounds of one run whose level moves by `drift` (log sd) per block of rounds, and whose
    overall level also sits at a random offset from every other run's."""
    level = rng.gauss(0, drift)
    out: list[float] = []
    while len(out) < n:
        block_level = level + rng.gauss(0, drift) if drift else level
        out += lognormal(rng, block, median * math.exp(block_level), cv)
    return out[:n]


def run_sequential(rng, slowdown: float | None, cv: float, tolerance: float | None = None, n0=8, batch=8, cap=32,
                   drift=0.0, use_drift=True) -> stats.GateDecision:
    """One baseline (its tolerance calibrated from it unless given), then one gated run slowed by
    `slowdown` (None: by the whole tolerance)."""
    looks = 1 + -(-(cap - n0) // batch)
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, looks)
    baseline = session(rng, cap, 10.0, cv, drift)
    est, df = stats.drift_sd(baseline, BLOCK) if use_drift else (0.0, 0)
    if tolerance is None:
        tolerance = stats.calibrated_tolerance(baseline, cap=cap, alpha=alpha, drift=est)
    run = session(rng, cap, 10.0 * (1 - (tolerance if slowdown is None else slowdown)), cv, drift)
    n = n0
    while True:
        d = stats.compare_samples("tokens_per_sec", baseline, run[:n], tolerance, alpha=alpha, at_cap=n >= cap,
                                  drift_sd=est)
        if d.verdict != Outcome.INCONCLUSIVE:
            return d
        n += batch


def rates(rng, trials, **kw):
    verdicts = [run_sequential(rng, **kw).verdict for _ in range(trials)]
    return {v: verdicts.count(v) / trials for v in (Outcome.PASS, Outcome.REGRESSION, Outcome.UNDECIDED)}


@pytest.mark.parametrize("cv", [0.03, 0.09])
def test_error_rates_at_the_calibrated_tolerance(cv):
    """Unchanged code fails at most ~1% and is left undecided at most ~2 beta (beta: 5%, with a
    drift estimate that is sometimes spuriously above 0); a slowdown of the full tolerance fails at
    least 95%."""
    rng = random.Random(1234)
    unchanged = rates(rng, 400, slowdown=0.0, cv=cv)
    slowed = rates(rng, 400, slowdown=None, cv=cv)
    assert unchanged[Outcome.REGRESSION] <= 0.015 and unchanged[Outcome.UNDECIDED] <= 2 * stats.DEFAULT_BETA
    assert slowed[Outcome.REGRESSION] >= 0.95


def test_between_run_drift_is_what_keeps_false_alarms_down():
    """Runs whose level moves (a shared host): ignoring the drift, unchanged code fails far more
    often than 1%; with the drift estimated from the baseline's blocks, the error rates hold at the
    tolerance calibrated with it."""
    rng = random.Random(99)
    cv, drift = 0.04, 0.05
    naive = rates(rng, 300, slowdown=0.0, cv=cv, drift=drift, use_drift=False)
    assert naive[Outcome.REGRESSION] > 0.05
    modelled = rates(rng, 300, slowdown=0.0, cv=cv, drift=drift)
    assert modelled[Outcome.REGRESSION] <= 0.02


def test_clear_cases_and_the_message():
    rng = random.Random(7)
    base = lognormal(rng, 20, 10.0, 0.02)
    same = stats.compare_samples("speedup", base, lognormal(rng, 20, 10.0, 0.02), 0.10)
    assert same.verdict == Outcome.PASS
    slow = stats.compare_samples("speedup", base, lognormal(rng, 20, 7.0, 0.02), 0.10, drift_sd=0.01)
    assert slow.verdict == Outcome.REGRESSION
    text = slow.describe()
    for part in ("speedup: baseline median", "measured median", "-29.9%", "tolerance 10%", "Welch t =", "n = 20",
                 "between-run spread 1.0%"):
        assert part in text


def test_noise_gives_inconclusive_then_undecided_at_the_cap():
    rng = random.Random(3)
    base, meas = lognormal(rng, 4, 10.0, 0.3), lognormal(rng, 4, 9.6, 0.3)
    d = stats.compare_samples("tokens_per_sec", base, meas, 0.10)
    assert d.verdict == Outcome.INCONCLUSIVE
    capped = stats.compare_samples("tokens_per_sec", base, meas, 0.10, at_cap=True)
    assert capped.verdict == Outcome.UNDECIDED  # never a pass or a fail by a coin toss
    assert "UNDECIDED at the cap of 4 rounds: this machine is too noisy to tell a 10% change" in capped.describe()


def test_drift_estimate():
    rng = random.Random(11)
    steady = [10 * math.exp(rng.gauss(0, 0.05)) for _ in range(64)]
    assert stats.drift_sd(steady, 8)[0] < 0.03
    moving = session(rng, 64, 10.0, 0.02, drift=0.1)
    est, df = stats.drift_sd(moving, 8)
    assert df == 7 and 0.04 < est < 0.25
    assert stats.drift_sd(steady[:12], 8) == (0.0, 0)


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
    assert stats.compare_exact(base, base).verdict == Outcome.PASS
    changed = {"p0": {**base["p0"], "accepted": 4}}
    d = stats.compare_exact(base, changed)
    assert d.verdict == Outcome.REGRESSION and "p0 accepted: baseline 5, measured 4" in d.describe()
    assert "p1: measured, not in the baseline" in stats.compare_exact(base, {**base, "p1": base["p0"]}).describe()


@pytest.mark.parametrize("p", [1e-6, 0.01, 0.2, 0.5, 0.8, 0.95, 0.975, 0.999, 1 - 1e-7])
@pytest.mark.parametrize("df", [1.0, 2.5, 7, 31, 1e4, math.inf])
def test_the_quantiles_are_scipy_stats_own(p, df):
    """Both gates' quantiles come from scipy.special (the light import); they equal scipy.stats'."""
    from scipy.stats import norm, t

    from harness.perf import errorrates

    assert errorrates.t_quantile(p, df) == pytest.approx(float(t.ppf(p, df)), rel=1e-12, abs=1e-12)
    assert errorrates.normal_quantile(p) == pytest.approx(float(norm.ppf(p)), rel=1e-12, abs=1e-12)


def test_a_verdict_does_not_import_scipy_stats():
    """Importing scipy.stats costs seconds of every gate's process (docs/ci.md): a decision of
    either gate and the calibrated tolerance run without it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from harness.perf.ab import paired\n"
            "from harness.perf.stored import stats\n"
            "from harness.perf import errorrates\n"
            "stats.compare_samples('speedup', [10.0, 10.2, 9.9, 10.1], [9.0, 9.1, 8.9, 9.2], 0.1)\n"
            "paired.decide('speedup', [0.99, 1.01, 0.98, 1.02], paired.Design(tolerance=0.1, tests=3, looks=4),"
            " at_cap=False)\n"
            "stats.calibrated_tolerance([10.0, 10.2, 9.9, 10.1], cap=8)\n"
            "errorrates.geometric_interval([1.0, 1.1, 0.9])\n"
            "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
