"""Verdicts: a combination's rounds against its baseline. The three gates (harness/perf/stored/stats.py),
more rounds while a statistical gate is inconclusive, and the confirmation of a FAIL."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import IntegrityError
from harness.perf.outcome import Outcome, combine
from harness.perf.stored import placement, stats
from harness.perf.record import METRICS, Samples
from harness.perf.runner import Runner
from harness.workload.decode import DecodeSettings

log = logging.getLogger(__name__)


class BaselineMismatchError(IntegrityError):
    """The baseline was measured with other settings than this run: its numbers are of other work."""


@dataclass
class Verdict:
    combination: str
    exact: stats.ExactDecision | None
    decisions: dict[str, stats.GateDecision]
    rounds: int
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.outcome == Outcome.REGRESSION

    @property
    def undecided(self) -> list[stats.GateDecision]:
        return [d for d in self.decisions.values() if d.verdict == Outcome.UNDECIDED]

    @property
    def outcome(self) -> Outcome:
        exact_failed = self.exact is not None and self.exact.verdict == Outcome.REGRESSION
        return combine((d.verdict for d in self.decisions.values()), behaviour_changed=exact_failed)

    def message(self, platform_id: str, baseline_file: str) -> str:
        what = "perf regression" if self.failed else "perf gate undecided"
        lines = [f"{what} in {self.combination} (platform {platform_id}, baseline {baseline_file}):"]
        if self.exact is not None and self.exact.verdict == Outcome.REGRESSION:
            lines.append("  " + self.exact.describe())
        for d in self.decisions.values():
            if d.verdict in (Outcome.REGRESSION, Outcome.UNDECIDED):
                lines.append("  " + d.describe())
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"If the change is intended, update this machine's baseline: "
                     f"pytest -m perf --perf-update-baselines -k '{self.combination}' and commit {baseline_file}")
        return "\n".join(lines)


def tolerances(baseline: dict[str, Any], override: float | None) -> dict[str, float]:
    return {m: (override or baseline["tolerance"][m]) for m in METRICS}


# decoding settings recorded since baselines first recorded theirs, at their defaults (what "off" means)
LATER_DECODE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DecodeSettings)
                                         if f.name in ("lookup_first", "fused_draft")}


def check_comparable(runner: Runner, baseline: dict[str, Any]) -> None:
    """Refuse to compare a run with a baseline of other work: other prompts, length, K, mode or
    decoding settings. Baselines written before the decoding settings were recorded are compared
    on what they hold; a sampled one without them cannot be trusted and is refused."""
    combo = runner.combo
    ours: dict[str, Any] = {"prompt_ids": [p.id for p in runner.prompts],
                            "max_new_tokens": runner.settings.max_new_tokens, "k": combo.k, "mode": combo.mode,
                            "decoding": combo.decoding, "target_precision": combo.target_precision,
                            "draft_precision": combo.draft_precision}
    differences = [f"{key} {baseline.get(key)!r} there, {value!r} here" for key, value in ours.items()
                   if baseline.get(key) != value]
    stored = baseline.get("decode")
    if stored is None and combo.decoding == "sampled":
        differences.append("the baseline does not record its sampling settings")
    elif stored is not None:
        now = runner.decode_record()
        stored = {**LATER_DECODE_DEFAULTS, **stored}  # a record from before a setting existed ran without it
        differences += [f"{key} {stored.get(key)!r} there, {value!r} here" for key, value in now.items()
                        if stored.get(key) != value]
    if differences:
        raise BaselineMismatchError(
            f"{combo.id}: the baseline was measured with other settings ({'; '.join(differences)}), so its "
            f"numbers are of other work. Measure it again: pytest -m perf --perf-update-baselines -k '{combo.id}'")


def check_placement(combination: str, threads: str, baseline: dict[str, Any]) -> None:
    """Refuse a baseline measured with another --perf-threads than this run's
    (harness/perf/stored/placement.py): one thread and every core measure different speeds and
    spreads. A record without `threads` was measured before the option, on every core."""
    there = baseline.get("threads", placement.ALL)
    if there != threads:
        raise BaselineMismatchError(
            f"{combination}: the baseline was measured with {placement.OPTION} {there}, this run measures with "
            f"{placement.OPTION} {threads}, so its numbers are of other work. Measure it again: pytest -m perf "
            f"--perf-update-baselines -k '{combination}', or check with {placement.OPTION} {there}")


def evaluate(runner: Runner, baseline: dict[str, Any]) -> Verdict:
    """All three gates. While a statistical gate is inconclusive, run more rounds (up to the cap)."""
    s = runner.settings
    notes = []
    exact = None
    if baseline.get("exact") is not None and runner.combo.decoding == "greedy":
        exact = stats.compare_exact(baseline["exact"], runner.exact_counters() or {})
        if not runner.counters_stable():
            exact = stats.ExactDecision(Outcome.REGRESSION, exact.differences + [
                "greedy counters changed between rounds in one process (nondeterministic decoding)"])
    tol = tolerances(baseline, s.tolerance_override)
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, s.looks())

    def decide(at_cap: bool) -> dict[str, stats.GateDecision]:
        return {m: stats.compare_samples(m, baseline[m]["samples"], runner.samples.metric(m), tol[m], alpha=alpha,
                                         at_cap=at_cap, drift_sd=baseline[m]["drift_sd"]) for m in METRICS}
    while True:
        at_cap = runner.samples.rounds() >= s.max_rounds
        decisions = decide(at_cap)
        if at_cap or all(d.verdict != Outcome.INCONCLUSIVE for d in decisions.values()):
            break
        if runner.rounds_left() <= 0:  # replayed rounds that end before the gate decided: their cap
            decisions = decide(True)
            break
        pending = [m for m, d in decisions.items() if d.verdict == Outcome.INCONCLUSIVE]
        log.info("%s: %s inconclusive after %d rounds; %d more", runner.combo.id, ", ".join(pending),
                 runner.samples.rounds(), s.batch)
        for _ in range(min(s.batch, runner.rounds_left())):
            runner.round()
    if any(d.verdict == Outcome.UNDECIDED for d in decisions.values()):
        notes.append(f"reached the cap of {runner.samples.rounds()} rounds without a decision")
    return Verdict(runner.combo.id, exact, decisions, runner.samples.rounds(), notes)


def confirm(runner: Runner, baseline: dict[str, Any], first: Verdict) -> Verdict:
    """Re-measure a statistical FAIL once, with fresh rounds, before reporting it.

    A shared machine can run a whole gate slow: CI once measured a tiny model at 0.23x its baseline
    for every round of a run. The gate rightly decides FAIL on such a run. A regression of the
    code is there again in a second measurement; a burst of contention usually is not. So a
    metric fails only when it fails in both measurements. One that failed once and passed or
    stayed inconclusive the second time is UNDECIDED, with both measurements in its note.
    Exact-counter failures are deterministic and are never re-measured."""
    if not first.failed or (first.exact is not None and first.exact.verdict == Outcome.REGRESSION):
        return first
    log.warning("%s: %s failed; confirming with fresh rounds", runner.combo.id,
                ", ".join(m for m, d in first.decisions.items() if d.verdict == Outcome.REGRESSION))
    runner.samples = Samples()
    while runner.samples.rounds() < runner.settings.rounds:
        runner.round()
    second = evaluate(runner, baseline)
    decisions, notes = {}, list(second.notes)
    for m, d in second.decisions.items():
        was = first.decisions[m]
        if was.verdict == Outcome.REGRESSION and d.verdict != Outcome.REGRESSION:
            decisions[m] = dataclasses.replace(d, verdict=Outcome.UNDECIDED)
            notes.append(f"{m} failed in a first measurement ({(was.ratio - 1) * 100:+.1f}%, CI "
                         f"[{was.ci_low:.3f}, {was.ci_high:.3f}], {was.n_measured} rounds) and not in its "
                         f"confirmation ({(d.ratio - 1) * 100:+.1f}%): contention during the first?")
        elif was.verdict != Outcome.REGRESSION and d.verdict == Outcome.REGRESSION:
            decisions[m] = dataclasses.replace(d, verdict=Outcome.UNDECIDED)
            notes.append(f"{m} failed only in the confirmation ({(d.ratio - 1) * 100:+.1f}%, CI "
                         f"[{d.ci_low:.3f}, {d.ci_high:.3f}], {d.n_measured} rounds), not in the first measurement "
                         f"({(was.ratio - 1) * 100:+.1f}%): contention during the second?")
        else:
            decisions[m] = d
            if was.verdict == Outcome.REGRESSION:
                notes.append(f"{m}: the failure was confirmed by a second, independent measurement "
                             f"(first {(was.ratio - 1) * 100:+.1f}%, then {(d.ratio - 1) * 100:+.1f}%)")
    return Verdict(first.combination, second.exact, decisions, first.rounds + second.rounds, notes)
