"""The A/B gate's paired statistics (harness/perf/ab/paired.py): verdicts on simulated per-round
ratios, and the sequential procedure's error rates on many simulated gates."""

from __future__ import annotations

import random

import pytest

from harness.perf.ab import paired
from harness.perf.outcome import Outcome, settled

TOL = 0.10
CLEAR = paired.Design(tolerance=TOL, tests=1, looks=1, family_alpha=0.002, miss_rate=0.001)


def ratios(rng: random.Random, change: float, noise: float, n: int) -> list[float]:
    return [(1 + change) * rng.lognormvariate(0, noise) for _ in range(n)]


@pytest.mark.parametrize("change, verdict", [(0.0, Outcome.PASS), (-0.10, Outcome.REGRESSION),
                                             (0.10, Outcome.IMPROVEMENT)])
def test_clear_changes_are_called(change, verdict):
    d = paired.decide("speedup", ratios(random.Random(1), change, 0.02, 12), CLEAR, at_cap=False)
    assert d.verdict == verdict
    assert d.ci_low < 1 + change < d.ci_high and d.rounds == 12
    assert d.describe().startswith(f"speedup: {verdict.word}, candidate/base")


def test_a_gate_stops_at_a_regression_or_when_every_metric_is_decided():
    assert settled([Outcome.REGRESSION, Outcome.INCONCLUSIVE])  # the outcome is a regression already
    assert settled([Outcome.PASS, Outcome.IMPROVEMENT])
    assert not settled([Outcome.PASS, Outcome.INCONCLUSIVE])


def test_too_noisy_is_inconclusive_then_undecided_at_the_cap():
    r = ratios(random.Random(2), -0.05, 0.10, 6)
    assert paired.decide("plain_tokens_per_sec", r, CLEAR, at_cap=False).verdict == Outcome.INCONCLUSIVE
    undecided = paired.decide("plain_tokens_per_sec", r, CLEAR, at_cap=True)
    assert undecided.verdict == Outcome.UNDECIDED and "too noisy to tell a 10% change" in undecided.describe()


def simulate(change: float, noise: float, trials: int, seed: int) -> dict[str, int]:
    """Whole sequential gates on one metric among 3 x 2 tests: rounds 6, batch 6, cap 30."""
    rng = random.Random(seed)
    rounds, batch, cap = 6, 6, 30
    design = paired.Design(tolerance=TOL, tests=6, looks=paired.looks(rounds, batch, cap))
    out: dict[str, int] = {}
    for _ in range(trials):
        r = ratios(rng, change, noise, cap)
        n = rounds
        while True:
            d = paired.decide("m", r[:n], design, at_cap=n >= cap)
            if d.verdict != Outcome.INCONCLUSIVE:
                break
            n = min(n + batch, cap)
        out[d.verdict] = out.get(d.verdict, 0) + 1
    return out


def test_sequential_error_rates():
    # A/A: a false regression or improvement in well under the family's 1% (one of six tests here)
    aa = simulate(0.0, 0.05, 2000, seed=3)
    assert aa.get(Outcome.REGRESSION, 0) + aa.get(Outcome.IMPROVEMENT, 0) <= 4, aa
    assert aa.get(Outcome.PASS, 0) >= 1990, aa  # a pass needs no false-alarm bar: unchanged code passes
    # a real 10% slowdown at the same noise: caught in nearly every gate, never passed
    slow = simulate(-0.10, 0.05, 500, seed=4)
    assert slow.get(Outcome.REGRESSION, 0) >= 490, slow
    assert slow.get(Outcome.PASS, 0) == 0, slow


def test_a_slowdown_at_the_threshold_passes_at_most_the_miss_rate():
    # exactly T/2 slower: PASS is the miss the design bounds by miss_rate (5%) over all looks
    edge = simulate(-TOL / 2, 0.05, 2000, seed=5)
    assert edge.get(Outcome.PASS, 0) <= 2000 * paired.DEFAULT_MISS_RATE, edge
    assert edge.get(Outcome.REGRESSION, 0) >= 600, edge  # about half the estimates fall beyond T/2


def test_noisy_machine_still_passes_unchanged_code():
    # 10% round-to-round spread (the tiny model on a noisy shared 2-core machine): A/A never calls a
    # regression and passes in most gates within the cap of 30; a PASS held to the false-alarm bar
    # (alpha, as a regression is) passed 159 of these 1000
    aa = simulate(0.0, 0.10, 1000, seed=6)
    assert aa.get(Outcome.REGRESSION, 0) == 0 and aa.get(Outcome.PASS, 0) >= 600, aa


def test_a_significant_change_below_half_the_tolerance_is_not_called():
    # 3% slower with a 0.5% spread: significant, but below T/2 (5%): it passes, never a regression
    # (one worker pair's offset looks like this; see paired.py)
    quiet = simulate(-0.03, 0.005, 300, seed=7)
    assert set(quiet) == {Outcome.PASS}, quiet
