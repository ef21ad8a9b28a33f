"""Per-phase costs of one generation: every forward pass of the target and of the draft is timed
and filed under the phase it belongs to, and the decode phase's wall time is split into those
passes and the host's own work between them (issue: the gate sees inside a step).

Phases (one home for their names; the decode phase is everything after the target's first pass):
  prefill        the target's first forward pass (assisted: the prompt fused with the first
                 verification); part of the record's prefill_ms, not of the decode phase
  draft_prefill  the draft's first forward pass (the prompt); also before the decode phase
  target_step    a target pass over one new token (plain decoding's step)
  verify         a target pass over more than one new token (an assisted step's verification of
                 the K drafted tokens and the last accepted one)
  draft_step     a draft pass in the decode phase (one token; the first pass of an assisted step
                 also takes the tokens accepted since the last one)
  overhead       the decode phase's wall time outside every forward pass: sampling, comparing the
                 candidates, cropping the caches, the Python between passes. Not a pass: one
                 figure per decode step (a step ends with its target pass), so its `calls` are
                 the decode steps and its median and 10th percentile are those of the steps.
  overhead_cpu   the same host work in the generating thread's CPU time (time.thread_time):
                 what a neighbour's burst that takes the core between two passes does not
                 inflate, since the thread does not run then; gated beside the wall-clock
                 overhead (harness/perf/record.py GATED_PHASES, docs/perf-gate.md). The time after
                 the last target pass is not in it (no CPU reading at the end of the call).
  target_step_cpu, verify_cpu, draft_step_cpu
                 each decode pass in the generating thread's CPU time: the same pass without the
                 time a neighbour held the core during it (the memory bandwidth it took still
                 shows). The whole pass where it runs on one thread (the A/B gate side by side);
                 with more intra-op threads, the generating thread's share of it.
                 Gated beside the wall clock's (harness/perf/record.py GATED_PHASES,
                 docs/perf-gate.md); not in the accounting, which is of the wall clock.

The accounting: the decode phase costs sum(calls x median) over the passes' phases plus the
overhead. `accounting` puts that prediction beside the measured decode time, so a run shows how
much of its time per token its forward passes explain; `combined` adds runs up, each at its own
medians.

Each pass is read from the host clock around the module's forward (pre and post hooks). On a CPU
the work is done when the call returns; on a GPU a pass returns before its kernels ran and timing
each one would need a synchronize per pass, so phases are timed on a CPU only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.machine.predict import StepCosts

PREFILL, DRAFT_PREFILL = "prefill", "draft_prefill"
TARGET_STEP, VERIFY, DRAFT_STEP, OVERHEAD = "target_step", "verify", "draft_step", "overhead"
OVERHEAD_CPU = "overhead_cpu"
TARGET_STEP_CPU, VERIFY_CPU, DRAFT_STEP_CPU = "target_step_cpu", "verify_cpu", "draft_step_cpu"
# A wall-clock phase's twin measured in the thread's CPU time: the same work, without the time a
# neighbour held the core. Where both arms report a gated twin, it is the one the gate waits on
# (harness/perf/ab/gate.py `suspects`).
CPU_TIME_OF = {OVERHEAD: OVERHEAD_CPU, TARGET_STEP: TARGET_STEP_CPU, VERIFY: VERIFY_CPU, DRAFT_STEP: DRAFT_STEP_CPU}
PASSES = (PREFILL, DRAFT_PREFILL, TARGET_STEP, VERIFY, DRAFT_STEP)
DECODE_PASSES = (TARGET_STEP, VERIFY, DRAFT_STEP)
PHASES = PASSES + (OVERHEAD, OVERHEAD_CPU) + tuple(CPU_TIME_OF[p] for p in DECODE_PASSES)

LOW_QUANTILE = 0.1  # the low statistic kept beside the median (PhaseCost.low_ms)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class PhaseCost:
    """One phase of one or more generations: how many calls and what they cost (milliseconds)."""

    calls: int
    total_ms: float
    median_ms: float
    low_ms: float  # the LOW_QUANTILE quantile of the calls

    @classmethod
    def of(cls, durations_ms: Sequence[float]) -> "PhaseCost":
        return cls(calls=len(durations_ms), total_ms=sum(durations_ms),
                   median_ms=quantile(durations_ms, 0.5), low_ms=quantile(durations_ms, LOW_QUANTILE))

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "PhaseCost":
        return cls(calls=int(doc["calls"]), total_ms=float(doc["total_ms"]), median_ms=float(doc["median_ms"]),
                   low_ms=float(doc["low_ms"]))


@dataclass(frozen=True)
class Call:
    """One forward pass: which model, how many new tokens it took, when it began and how long it ran,
    on the clock and (where read) in the generating thread's CPU time."""

    model: str  # "target" | "draft"
    tokens: int
    start: float
    seconds: float
    cpu_start: float = math.nan
    cpu_seconds: float = math.nan


def new_tokens(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """The sequence length a forward pass was given (input_ids, or inputs_embeds)."""
    for value in (kwargs.get("input_ids"), args[0] if args else None, kwargs.get("inputs_embeds")):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) >= 2:
            return int(shape[1])
    return 1


@dataclass
class PassTimer:
    """Counts the forward passes of the models it is attached to (one generate call), reads the
    clock when the target's first pass ends (the prefill), and with `timed` times every pass.
    Untimed (a GPU): one clock read in all, so the run is not slowed by a synchronize per pass."""

    clock: Callable[[], float]
    timed: bool = True
    cpu_clock: Callable[[], float] | None = None  # with `timed`: each pass's CPU time too (time.thread_time)
    calls: list[Call] = field(default_factory=list)
    target_passes: int = 0
    first_target_end: float | None = None

    def attach(self, module: Any, name: str) -> list[Any]:
        """Hooks on `module`'s forward, filed as `name`; returns the handles to remove."""
        started: list[tuple[float, float, int]] = []
        cpu = self.cpu_clock if self.timed and self.cpu_clock else (lambda: math.nan)

        def before(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            started.append((self.clock() if self.timed else math.nan, cpu(), new_tokens(args, kwargs)))

        def after(mod: Any, args: Any, output: Any) -> None:
            c1 = cpu()
            t0, c0, tokens = started.pop()
            first_target = name == "target" and self.first_target_end is None
            t1 = self.clock() if (self.timed or first_target) else math.nan
            if name == "target":
                self.target_passes += 1
                if first_target:
                    self.first_target_end = t1
            if self.timed:
                self.calls.append(Call(name, tokens, t0, t1 - t0, c0, c1 - c0))

        return [module.register_forward_pre_hook(before, with_kwargs=True), module.register_forward_hook(after)]


def split(calls: Iterable[Call], decode_start: float, decode_end: float) -> dict[str, PhaseCost]:
    """The phases of one generation from its timed passes; `decode_start`: the end of the target's
    first pass, `decode_end`: the end of the generate call."""
    ms: dict[str, list[float]] = {}
    first: set[str] = set()
    decode: list[Call] = []
    prefill: Call | None = None
    for c in sorted(calls, key=lambda c: c.start):
        if c.model not in first:
            first.add(c.model)
            phase = PREFILL if c.model == "target" else DRAFT_PREFILL
            prefill = c if phase == PREFILL else prefill
        elif c.start < decode_start:
            continue  # the draft's first K tokens: part of the prefill phase, not a decode step
        elif c.model == "target":
            phase = TARGET_STEP if c.tokens == 1 else VERIFY
        else:
            phase = DRAFT_STEP
        ms.setdefault(phase, []).append(c.seconds * 1000.0)
        if c.start >= decode_start:
            decode.append(c)
            if phase in DECODE_PASSES and not math.isnan(c.cpu_seconds):
                ms.setdefault(CPU_TIME_OF[phase], []).append(c.cpu_seconds * 1000.0)
    out = {phase: PhaseCost.of(ms[phase]) for phase in PHASES if phase in ms}
    per_step = step_overheads_ms(decode, decode_start, decode_end)
    if per_step:
        out[OVERHEAD] = PhaseCost.of(per_step)
    per_step_cpu = step_cpu_overheads_ms(decode, prefill)
    if per_step_cpu:
        out[OVERHEAD_CPU] = PhaseCost.of(per_step_cpu)
    return out


def step_overheads_ms(decode: Sequence[Call], decode_start: float, decode_end: float) -> list[float]:
    """The host's work in each decode step: a step ends with its target pass (a plain step's, or an
    assisted step's verification), and its overhead is its wall time outside the passes in it. The
    time after the last target pass joins the last step, so the steps' sum is the decode phase's
    wall time outside every pass. One figure per step, so the steps' median and 10th percentile are
    kept beside their mean (the gate reads the mean: the steps of a prompt differ by design,
    docs/perf-gate.md)."""
    steps: list[float] = []
    begun, inside = decode_start, 0.0
    for c in decode:
        inside += c.seconds
        if c.model == "target":
            end = c.start + c.seconds
            steps.append(max(0.0, (end - begun - inside) * 1000.0))
            begun, inside = end, 0.0
    if steps:
        steps[-1] += max(0.0, (decode_end - begun - inside) * 1000.0)
    return steps


def step_cpu_overheads_ms(decode: Sequence[Call], prefill: Call | None) -> list[float]:
    """The host's work in each decode step in CPU time: the thread's CPU time between one pass's end
    and the next's start, summed up to the step's target pass; from the prefill's end. None read
    (untimed, or no CPU clock): no steps."""
    if prefill is None or math.isnan(prefill.cpu_start) or any(math.isnan(c.cpu_start) for c in decode):
        return []
    steps: list[float] = []
    ended, gaps = prefill.cpu_start + prefill.cpu_seconds, 0.0
    for c in decode:
        gaps += max(0.0, c.cpu_start - ended)
        ended = c.cpu_start + c.cpu_seconds
        if c.model == "target":
            steps.append(gaps * 1000.0)
            gaps = 0.0
    return steps


def pooled(runs: Iterable[Mapping[str, PhaseCost]]) -> dict[str, PhaseCost]:
    """Several generations' phases as one: calls and totals summed, the median and low statistic
    the median of the runs' (every run weighs the same)."""
    by_phase: dict[str, list[PhaseCost]] = {}
    for run in runs:
        for phase, cost in run.items():
            by_phase.setdefault(phase, []).append(cost)
    return {phase: PhaseCost(calls=sum(c.calls for c in costs), total_ms=sum(c.total_ms for c in costs),
                             median_ms=quantile([c.median_ms for c in costs], 0.5),
                             low_ms=quantile([c.low_ms for c in costs], 0.5))
            for phase in PHASES if (costs := by_phase.get(phase))}


@dataclass(frozen=True)
class Accounting:
    """The decode phase explained by its passes: sum(calls x median) beside the measured time."""

    decode_tokens: int
    measured_ms: float      # the decode phase's wall time
    passes_ms: float        # sum over the decode passes' phases of calls x median
    overhead_ms: float      # the measured wall time outside every pass (summed, not predicted)

    @property
    def predicted_per_token_ms(self) -> float:
        return self.passes_ms / self.decode_tokens

    @property
    def measured_per_token_ms(self) -> float:
        return self.measured_ms / self.decode_tokens

    @property
    def overhead_per_token_ms(self) -> float:
        return self.overhead_ms / self.decode_tokens

    @property
    def error(self) -> float:
        """predicted / measured - 1: how far the passes alone are from the measured time."""
        return self.passes_ms / self.measured_ms - 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"decode_tokens": self.decode_tokens, "measured_ms": round(self.measured_ms, 3),
                "passes_ms": round(self.passes_ms, 3), "overhead_ms": round(self.overhead_ms, 3),
                "predicted_per_token_ms": round(self.predicted_per_token_ms, 4),
                "measured_per_token_ms": round(self.measured_per_token_ms, 4), "error": round(self.error, 5)}


def accounting(phases: Mapping[str, PhaseCost], decode_tokens: int, measured_ms: float) -> Accounting | None:
    """None when the decode phase produced no token or no pass was timed."""
    passes = [phases[p] for p in DECODE_PASSES if p in phases]
    if decode_tokens <= 0 or measured_ms <= 0 or not passes:
        return None
    overhead = phases[OVERHEAD].total_ms if OVERHEAD in phases else 0.0
    return Accounting(decode_tokens=decode_tokens, measured_ms=measured_ms,
                      passes_ms=sum(p.calls * p.median_ms for p in passes), overhead_ms=overhead)


def combined(accounts: Iterable[Accounting | None]) -> Accounting | None:
    """Several runs' accountings as one: each run's passes at its own medians, summed (runs over
    other context lengths cost differently; one median for all of them would weigh them wrong)."""
    given = [a for a in accounts if a is not None]
    if not given:
        return None
    return Accounting(decode_tokens=sum(a.decode_tokens for a in given), measured_ms=sum(a.measured_ms for a in given),
                      passes_ms=sum(a.passes_ms for a in given), overhead_ms=sum(a.overhead_ms for a in given))


def step_costs(plain: Mapping[str, PhaseCost] | None, assisted: Mapping[str, PhaseCost] | None,
               k: int) -> StepCosts | None:
    """The step costs in the prediction's terms (harness/machine/predict.py) from a run's own passes:
    the plain arm's target step, the assisted arm's verification and draft step (medians). None
    without a timed target step or verification."""
    if not plain or not assisted or TARGET_STEP not in plain or VERIFY not in assisted:
        return None
    draft = assisted.get(DRAFT_STEP)
    return StepCosts(target_ms=plain[TARGET_STEP].median_ms, verify_ms=assisted[VERIFY].median_ms,
                     draft_ms=draft.median_ms if draft else None, k=k)


def acceptance_by_position(drafted_per_step: Iterable[Sequence[int]],
                           accepted_per_step: Iterable[Sequence[int]]) -> list[float]:
    """For each drafted position i (0-based), the share of steps that drafted a token there whose
    target kept it: accepted >= i + 1 over drafted >= i + 1, pooled over runs."""
    offered: list[int] = []
    kept: list[int] = []
    for drafted_run, accepted_run in zip(drafted_per_step, accepted_per_step):
        for drafted, accepted in zip(drafted_run, accepted_run):
            while len(offered) < drafted:
                offered.append(0)
                kept.append(0)
            for i in range(drafted):
                offered[i] += 1
                kept[i] += accepted >= i + 1
    return [k / o for k, o in zip(kept, offered)]


def lines(costs: Mapping[str, PhaseCost], account: Accounting | None,
          acceptance: Sequence[float] | None = None) -> list[str]:
    """Where a decode phase's time went, for a terminal: its passes' medians, the accounting and
    (assisted) the acceptance by drafted position."""
    shown = [f"{phase} {costs[phase].median_ms:.1f} ms x {costs[phase].calls}" for phase in DECODE_PASSES if phase in costs]
    out = ["phases (median ms x passes): " + ", ".join(shown)] if shown else []
    if account is not None:
        out.append(f"per token: passes {account.predicted_per_token_ms:.1f} ms (sum of passes x median) + host overhead "
                   f"{account.overhead_per_token_ms:.1f} ms; measured {account.measured_per_token_ms:.1f} ms "
                   f"(passes alone {account.error:+.1%})")
    if acceptance:
        out.append("accepted by drafted position: " + " ".join(f"{p:.0%}" for p in acceptance))
    return out
