"""The perf gate's records, one home each: a round of one arm (`Round`), an arm's rounds so far
(`Samples`) and a combination's result (`CombinationResult`, an entry of results.json).

The worker answers a round request with a `Round`'s JSON, the runner keeps its rounds as `Round`s,
both gates decide on them and the report reads them back from results.json. A gated metric is a
field of `Round` named in METRICS: adding one is that field and its name there. The JSON schema
(harness/schemas/perf-results.schema.json) is checked against these dataclasses by a test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import IntegrityError
from harness.measure import phases
from harness.measure.phases import PhaseCost
from harness.perf.outcome import Outcome

# The gated metrics, each a higher-is-better field of Round.
METRICS = ("speedup", "assisted_tokens_per_sec", "plain_tokens_per_sec")
COUNTERS = ("new_tokens", "drafted", "accepted", "target_forwards")
# A round's phases: the plain runs' target step and prefill, the assisted runs' verification, draft
# step, draft prefill and host overhead per step, and the decode passes and overhead in CPU time too
# (harness/measure/phases.py).
PLAIN_PHASES = (phases.PREFILL, phases.TARGET_STEP, phases.TARGET_STEP_CPU)
ASSISTED_PHASES = (phases.DRAFT_PREFILL, phases.VERIFY, phases.DRAFT_STEP, phases.OVERHEAD, phases.OVERHEAD_CPU,
                   phases.VERIFY_CPU, phases.DRAFT_STEP_CPU)
ROUND_PHASES = PLAIN_PHASES + ASSISTED_PHASES
# The phases the A/B gate decides on (lower is better), each read by the statistic of its passes
# whose A/A spread was smallest (benchmarks/phase_spread.py, docs/perf-gate.md): the 10th
# percentile for the one-token steps; the mean for the verification (about 10 passes a prompt, so
# its 10th percentile is nearly its minimum) and for the overhead (measured when it was one figure
# per run; its steps' median and 10th percentile are recorded since, docs/perf-gate.md).
# Each also in CPU time (its twin, phases.CPU_TIME_OF), by the same statistic: under a co-tenant the
# twins spread a quarter (the verification) to three quarters as much a round as the wall clock
# and see a slower pass in full; the wall clock's stays for work that waits without running
# (docs/perf-gate.md, "Which phase keeps the gate looking").
GATED_PHASES = {phases.TARGET_STEP: "p10", phases.DRAFT_STEP: "p10", phases.VERIFY: "mean", phases.OVERHEAD: "mean",
                phases.OVERHEAD_CPU: "mean", phases.TARGET_STEP_CPU: "p10", phases.DRAFT_STEP_CPU: "p10",
                phases.VERIFY_CPU: "mean"}


class RecordError(IntegrityError):
    """A round or a result that does not hold what its record says (a worker speaking nonsense)."""


@dataclass(frozen=True)
class Round:
    """One round of one arm: every prompt once plain and once assisted."""
    plain_tokens_per_sec: float
    assisted_tokens_per_sec: float
    speedup: float                       # assisted / plain inside the round
    counters: dict[str, dict[str, int]]  # prompt id -> greedy counters (COUNTERS) of its assisted run
    cpu_s: float | None = None           # CPU time the arm's process used in the round
    wall_s: float | None = None          # the round's wall time
    cpu: int | None = None               # side by side: the core the round started on (swap_s: cores alternate); else None
    phases: dict[str, PhaseCost] | None = None  # the round's passes by phase (ROUND_PHASES); None: untimed, or an older worker
    acceptance_by_position: list[float] | None = None  # drafted position i -> share of steps keeping it
    page_faults: int | None = None       # the generating thread's page faults in the round (timing.thread_page_faults); None: not counted (no per-thread count, an older worker)

    def metric(self, name: str) -> float:
        return getattr(self, name)

    def phase_ms(self, name: str) -> float | None:
        """A gated phase's cost in this round, by its statistic (GATED_PHASES); None where the
        round has no passes of it (an untimed round, an older worker, a combination without them)."""
        cost = (self.phases or {}).get(name)
        if cost is None or cost.calls == 0:
            return None
        return cost.low_ms if GATED_PHASES[name] == "p10" else cost.total_ms / cost.calls

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], source: str) -> "Round":
        """A round from a worker's answer or a results file; RecordError naming `source` when a
        metric is missing or not a positive finite number, or the counters are malformed."""
        values: dict[str, Any] = {}
        for name in METRICS:
            v = doc.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise RecordError(f"{source}: round field {name!r} must be a positive number, got {v!r}")
            values[name] = float(v)
        counters = doc.get("counters")
        if not isinstance(counters, Mapping) or not all(
                isinstance(c, Mapping) and all(isinstance(c.get(k), int) for k in COUNTERS) for c in counters.values()):
            raise RecordError(f"{source}: round field 'counters' must map each prompt to {', '.join(COUNTERS)}")
        optional = {k: doc.get(k) for k in ("cpu_s", "wall_s", "cpu") if doc.get(k) is not None}
        if doc.get("page_faults") is not None:
            faults = doc["page_faults"]
            if isinstance(faults, bool) or not isinstance(faults, int) or faults < 0:
                raise RecordError(f"{source}: round field 'page_faults' must be a count (an integer, 0 or more), got {faults!r}")
            optional["page_faults"] = faults
        if doc.get("phases") is not None:
            optional["phases"] = _phases_from(doc["phases"], source)
        if doc.get("acceptance_by_position") is not None:
            shares = doc["acceptance_by_position"]
            if not isinstance(shares, list) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in shares):
                raise RecordError(f"{source}: round field 'acceptance_by_position' must be a list of shares in [0, 1]")
            optional["acceptance_by_position"] = [float(v) for v in shares]
        return cls(**values, counters={p: {k: int(c[k]) for k in COUNTERS} for p, c in counters.items()}, **optional)


def worker_round(doc: Mapping[str, Any], source: str) -> tuple[Round, list[str]]:
    """A round from a worker's answer, and the phases in it that this revision does not know: a newer
    worker's (a base revision ahead of the working tree) are set aside, not refused, so that the gate
    decides on what both arms report and says which it could not compare."""
    reported = doc.get("phases")
    unknown = sorted(set(reported) - set(ROUND_PHASES)) if isinstance(reported, Mapping) else []
    if unknown:
        doc = {**doc, "phases": {p: c for p, c in reported.items() if p in ROUND_PHASES}}
    return Round.from_json(doc, source), unknown


def _phases_from(doc: Any, source: str) -> dict[str, PhaseCost]:
    """A round's phases, each a PhaseCost of non-negative finite numbers; RecordError naming `source`."""
    if not isinstance(doc, Mapping) or not set(doc) <= set(ROUND_PHASES):
        raise RecordError(f"{source}: round field 'phases' must map some of {', '.join(ROUND_PHASES)} to costs")
    out: dict[str, PhaseCost] = {}
    for name, cost in doc.items():
        try:
            out[name] = PhaseCost.from_dict(cost)
        except (KeyError, TypeError, ValueError):
            raise RecordError(f"{source}: round phase {name!r} must hold calls, total_ms, median_ms, low_ms") from None
        if not all(math.isfinite(v) and v >= 0 for v in (out[name].total_ms, out[name].median_ms, out[name].low_ms)):
            raise RecordError(f"{source}: round phase {name!r} must hold non-negative finite times")
    return out


@dataclass
class Samples:
    """An arm's rounds so far, in order."""
    items: list[Round] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.items.append(r)

    def rounds(self) -> int:
        return len(self.items)

    def metric(self, name: str) -> list[float]:
        return [r.metric(name) for r in self.items]

    @property
    def counters(self) -> list[dict[str, dict[str, int]]]:
        return [r.counters for r in self.items]


def acceptance_rate(counters: Mapping[str, Mapping[str, int]]) -> float | None:
    """Accepted / drafted over one round's prompts; None without drafted tokens."""
    drafted = sum(c["drafted"] for c in counters.values())
    return sum(c["accepted"] for c in counters.values()) / drafted if drafted else None


@dataclass(frozen=True)
class ABDetail:
    """What the A/B gate adds to a result: the base's rounds beside the candidate's."""
    base: str                             # "<revision> <sha12>"
    candidate: str
    mode: str                             # "duet" (side by side) or "interleaved"
    base_rounds: list[Round]
    ratios: dict[str, list[float]]        # metric -> per round, candidate / base
    redone: int                           # round pairs measured again after a disturbance
    restarts: int                         # worker pairs restarted
    behaviour_changes: list[str]          # greedy counters that differ between the arms
    # the arms' Python environments, {"base": {python, label, versions}, "candidate": {...}, "differences":
    # {package: [base's version, candidate's]}} (harness/perf/ab/environment.py); None: replayed, or before schema 5
    environments: dict[str, Any] | None = None
    # side by side: the period (s) at which the arms exchanged cores within a round (--perf-duet-swap);
    # None: between rounds only, in turn, replayed, or before schema 6
    swap_s: float | None = None
    # live side by side: the rounds in which the stand-in (harness/perf/ab/standin.py) took the core of the arm
    # that finished first (runs started together: that waited for the other at a run's end or the round's; 0: it
    # could not start, said in the notes); None: in turn, replayed, or before schema 7
    stand_in_rounds: int | None = None
    # live side by side with --perf-duet-sync on: the rounds in which both arms started each run (a prompt in one
    # mode) together (0: the base's worker cannot, said in the notes); None: not asked, in turn, replayed, or
    # before schema 8
    synced_rounds: int | None = None


@dataclass
class CombinationResult:
    """One combination's entry of results.json, whichever gate ran it."""
    combination: str
    platform: str
    gate: str                             # "stored", "ab" or "update" (--perf-update-baselines)
    verdict: Outcome
    rounds: list[Round]                   # this tree's rounds (A/B: the candidate's)
    acceptance_rate: float | None = None
    notes: list[str] = field(default_factory=list)
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> its decision
    exact: Outcome | None = None          # stored gate: greedy counters against the baseline's
    host: dict[str, Any] | None = None    # stored gate: this host's probe against the baseline's
    tolerance: dict[str, Any] | None = None  # update: the tolerances the new baseline calibrated
    ab: ABDetail | None = None

    def metric(self, name: str) -> list[float]:
        return [r.metric(name) for r in self.rounds]

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["verdict"] = self.verdict.value
        doc["exact"] = None if self.exact is None else self.exact.value
        return doc


def rounds_from(docs: Sequence[Mapping[str, Any]], source: str) -> list[Round]:
    return [Round.from_json(d, f"{source} round {i + 1}") for i, d in enumerate(docs)]
