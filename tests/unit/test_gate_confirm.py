"""confirm: a statistical FAIL is re-measured once; it stays a FAIL only if the second,
independent measurement fails too. Rounds come from a script (a burst of contention, then a
quiet machine; or a real regression throughout), so the outcome is deterministic."""

from __future__ import annotations

import random
from types import SimpleNamespace

from harness.perf.record import METRICS, Round, Samples
from harness.perf.stored.verdict import Verdict, confirm, evaluate
from harness.perf.outcome import Outcome

SETTINGS = SimpleNamespace(rounds=8, batch=8, max_rounds=16, looks=lambda: 2, tolerance_override=None)


class ScriptedRunner:
    """The part of Runner that evaluate/confirm use; round() takes the next scripted level."""

    def __init__(self, levels: list[float], seed: int = 0):
        self.combo = SimpleNamespace(id="pair:bf16+w8af32:cpu:greedy:k6", decoding="sampled")
        self.settings = SETTINGS
        self.samples = Samples()
        self.levels, self.rng = list(levels), random.Random(seed)

    def round(self) -> None:
        level = self.levels.pop(0)  # one level for both modes, or (plain level, assisted level)
        plain_level, assisted_level = level if isinstance(level, tuple) else (level, level)
        noise = lambda: self.rng.lognormvariate(0, 0.03)  # noqa: E731
        plain, assisted = 10 * plain_level * noise(), 20 * assisted_level * noise()
        self.samples.add(Round(plain_tokens_per_sec=plain, assisted_tokens_per_sec=assisted, speedup=assisted / plain,
                               counters={}))

    def rounds_left(self) -> int:
        return self.settings.max_rounds - self.samples.rounds()

    def exact_counters(self):
        return None

    def counters_stable(self) -> bool:
        return True


def baseline() -> dict:
    rng = random.Random(42)
    doc = {"exact": None, "tolerance": {m: 0.1 for m in METRICS}}
    plain = [10 * rng.lognormvariate(0, 0.03) for _ in range(16)]
    assisted = [20 * rng.lognormvariate(0, 0.03) for _ in range(16)]
    for name, values in (("plain_tokens_per_sec", plain), ("assisted_tokens_per_sec", assisted),
                         ("speedup", [a / p for a, p in zip(assisted, plain)])):
        doc[name] = {"samples": values, "drift_sd": 0.0}
    return doc


def first_then_confirm(levels: list[float]) -> tuple[Verdict, Verdict]:
    runner = ScriptedRunner(levels)
    for _ in range(SETTINGS.rounds):
        runner.round()
    first = evaluate(runner, baseline())
    return first, confirm(runner, baseline(), first)


def test_a_burst_of_contention_is_undecided_not_failed():
    first, final = first_then_confirm([0.25] * 16 + [1.0] * 16)
    assert first.failed and first.decisions["plain_tokens_per_sec"].verdict == Outcome.REGRESSION
    assert not final.failed
    assert final.decisions["plain_tokens_per_sec"].verdict == Outcome.UNDECIDED
    assert any("failed in a first measurement (-75" in n and "not in its confirmation" in n for n in final.notes)
    assert final.rounds > first.rounds  # both measurements counted


def test_a_real_regression_fails_twice_and_says_it_was_confirmed():
    first, final = first_then_confirm([0.6] * 32)
    assert first.failed and final.failed
    assert final.decisions["plain_tokens_per_sec"].verdict == Outcome.REGRESSION
    assert any("confirmed by a second, independent measurement" in n for n in final.notes)


def test_a_metric_that_fails_only_in_the_confirmation_is_undecided():
    # first: the whole machine slow (both tokens/s fail, speedup passes); then: only assisted slow
    first, final = first_then_confirm([(0.25, 0.25)] * 16 + [(1.0, 0.5)] * 16)
    assert first.decisions["speedup"].verdict == Outcome.PASS
    assert final.decisions["speedup"].verdict == Outcome.UNDECIDED
    assert final.decisions["plain_tokens_per_sec"].verdict == Outcome.UNDECIDED
    assert final.decisions["assisted_tokens_per_sec"].verdict == Outcome.REGRESSION  # failed both times
    assert any(n.startswith("speedup failed only in the confirmation") for n in final.notes)


def test_a_pass_is_not_measured_again():
    first, final = first_then_confirm([1.0] * 16)
    assert not first.failed and final is first
