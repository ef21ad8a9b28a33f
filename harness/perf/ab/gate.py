"""The A/B gate for one combination: base and candidate measured in one job, round by round.

Each round runs one perf round (every prompt plain and assisted) in each arm's worker, the two in
a random order; the load guard redoes a round pair that another process disturbed. Every
`restart_every` rounds both workers are restarted (and warmed up again), so that no single
process, lucky or unlucky in its memory placement, decides the gate. After `rounds`, then every
`batch` rounds up to `cap`, the paired statistics (harness/perf/ab/paired.py) decide each metric;
the gate stops when one regressed or all are decided, unless a phase is still a suspect (`_settled`).
Greedy counters (drafted, accepted, target forwards per prompt) are compared exactly between the
arms: a difference is a behaviour change, not noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import BadInputError
from harness.measure import phases
from harness.perf.ab import duet, paired
from harness.perf.ab.standin import StandIn
from harness.perf.outcome import Outcome, combine, settled
from harness.perf.ab.arms import Arm, ArmError, first_to_answer
from harness.perf.ab.environment import Environment
from harness.perf.combinations import Combination, PerfSettings
from harness.perf.ab.loadguard import LoadGuard
from harness.perf.ab.worker import SYNC
from harness.perf.record import GATED_PHASES, METRICS, Round, worker_round

log = logging.getLogger(__name__)

MAX_REDOS_PER_ROUND = 3
# Names the rule by which the gate stops and decides (`_settled`, `suspect`, `suspects`, `standing`,
# harness/perf/ab/paired.py): rates resampled from recorded rounds under another rule are stale
# (benchmarks/gate_power_table.py). Change it with the rule.
STOPPING_RULE = ("2026-12-05b: a tokens/s regression waits while a phase is a suspect (its estimate beyond T/2), "
                 "a wall-clock phase not where its CPU time is compared; every phase gated in CPU time too")
HEADLINES = {Outcome.REGRESSION: "perf regression", Outcome.UNDECIDED: "perf gate undecided",
             Outcome.PASS: "perf gate passed", Outcome.IMPROVEMENT: "perf improvement"}


@dataclass(frozen=True)
class ABSettings:
    tolerance: float = 0.10
    family_alpha: float = paired.DEFAULT_FAMILY_ALPHA
    miss_rate: float = paired.DEFAULT_MISS_RATE
    combinations: int = 1           # combinations gated in the whole run (the false-alarm family)
    restart_every: int = 4          # so the first look (8 rounds) already spans two worker pairs
    # A phase keeps the gate looking while its estimate lies beyond T/2 and this many standard errors
    # from no change (`suspect`); 0: the estimate alone. Larger ends unchanged gates sooner and catches
    # a slower phase less often (docs/perf-gate.md, "Which phase keeps the gate looking").
    suspect_z: float = 0.0
    seed: int = 0

    def design(self, settings: PerfSettings, metrics: int) -> paired.Design:
        """The thresholds for `metrics` decided metrics in each of the run's combinations."""
        return paired.Design(tolerance=self.tolerance, tests=metrics * self.combinations,
                             looks=settings.looks(),
                             family_alpha=self.family_alpha, miss_rate=self.miss_rate)


@dataclass
class ABResult:
    combination: str
    base: str
    candidate: str
    decisions: dict[str, paired.PairedDecision]
    ratios: dict[str, list[float]]            # per round, candidate / base
    rounds: int
    redone: int
    restarts: int
    samples: dict[str, list[Round]]           # arm -> its rounds
    mode: str                                 # how the arms' rounds ran: "duet" (side by side) or "interleaved"
    counter_differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    environments: dict[str, Environment] | None = None  # arm -> the environment its worker ran in (None: replayed)
    swap_s: float | None = None               # side by side: the arms exchanged cores every swap_s s within a round
    cut_short: bool = False                   # replayed: the recording ended before the gate decided
    stand_in_rounds: int | None = None        # live side by side: rounds whose first arm to finish the stand-in
    #                                           replaced; None: in turn, or replayed (no process to stand in for)
    synced_rounds: int | None = None          # live side by side with --perf-duet-sync on: rounds whose runs both
    #                                           arms started together (0: the base's worker cannot); else None

    @property
    def environment_changes(self) -> dict[str, tuple[str | None, str | None]]:
        """Every package whose version differs between the arms' environments: name -> (base's, candidate's)."""
        envs = self.environments
        return envs["base"].differences(envs["candidate"]) if envs else {}

    def environment_line(self) -> str | None:
        """Where the arms ran in two environments: both, and what differs between them."""
        envs = self.environments
        if not envs or envs["base"].python == envs["candidate"].python:
            return None
        changes = self.environment_changes
        differ = ("; they differ in " + ", ".join(f"{name} {b or 'absent'} (base) / {c or 'absent'} (candidate)"
                                                  for name, (b, c) in changes.items())
                  if changes else "; they report the same packages at the same versions")
        return (f"environments: base {envs['base'].label} ({envs['base'].python}), candidate "
                f"{envs['candidate'].label} ({envs['candidate'].python}){differ}")

    @property
    def outcome(self) -> Outcome:
        return combine(gating(self.decisions), behaviour_changed=bool(self.counter_differences))

    def message(self) -> str:
        head = HEADLINES[self.outcome]
        lines = [f"{head} in {self.combination}: candidate {self.candidate} against base {self.base}, "
                 f"{self.rounds} paired rounds ({self.redone} redone after a disturbance, {self.restarts} worker "
                 "restarts):"]
        lines += ["  " + d.describe() for d in self.decisions.values()]
        lines += [f"  behaviour change: {c}" for c in self.counter_differences]
        if environments := self.environment_line():
            lines.append("  " + environments)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class ABGate:
    swapping_class = duet.Swapping  # side by side: what exchanges the arms' cores within a round

    def __init__(self, combo: Combination, settings: PerfSettings, base: Arm, candidate: Arm,
                 load_request: Callable[[str], dict[str, Any]], ab: ABSettings, guard: LoadGuard | None = None,
                 plan: duet.Plan | None = None, available: int | None = None):
        self.combo, self.settings, self.ab = combo, settings, ab
        # the rounds there are to run: the settings' cap, or fewer when the arms replay a recording;
        # the statistical design (its looks) stays the settings', so a replay decides as the live gate did
        self.cap = min(settings.max_rounds, available) if available is not None else settings.max_rounds
        self.plan = plan or duet.IN_TURN
        self.arms = {"base": base, "candidate": candidate}
        self.load_request = load_request  # arm name -> its load request (the candidate's may plant a slowdown)
        self.guard = guard or LoadGuard()
        self.rng = random.Random(ab.seed)
        self.samples: dict[str, list[Round]] = {"base": [], "candidate": []}
        self.redone = 0
        self.restarts = 0
        self.stand_in: StandIn | None = None  # duet: takes the core of the arm that finishes a round first
        self.covering = False                 # it did in the round now measured
        self.covered: int | None = None       # rounds kept in which it did; None: no live arms side by side
        self.in_step = False                  # both arms started each run of the round now measured together
        self.synced: int | None = None        # rounds kept in which they did; None: not asked, or no live duet
        self.notes: list[str] = []            # said in the result, beside the phases' and the looks' notes
        self.unknown: set[str] = set()        # phases the base's worker reported that this revision does not know

    def _load_all(self) -> None:
        """Load (and warm up) both arms' models at once, side by side on their cores in duet. Nothing
        is timed while they load, so the arms need not take turns; on a GPU host, where a tiny pair's
        rounds take about a second, loading in turn doubled a gate's time (docs/bench.md)."""
        if self.plan.duet:
            self._pin(0)
        for name, arm in self.arms.items():
            arm.send(self.load_request(name))
        for name, arm in self.arms.items():
            self._loaded(arm.receive("load"))

    def _pin(self, index: int) -> dict[str, int | None]:
        """Duet: each arm's core for round `index` (they swap every round), every thread pinned."""
        cores = {name: self.plan.core(i, index) for i, name in enumerate(self.arms)}
        for name, arm in self.arms.items():
            if cores[name] is not None and arm.process is not None:
                duet.pin(arm.process.pid, cores[name])
        return cores

    def _loaded(self, answer: dict[str, Any]) -> None:
        other = getattr(self, "prompt_ids", None)
        if other is not None and answer["prompt_ids"] != other:
            raise BadInputError(f"{self.combo.id}: the arms run different prompts ({other} against "
                               f"{answer['prompt_ids']}): the registry's prompt set differs between the two "
                               "revisions; pass --perf-matrix to give both arms one registry")
        self.prompt_ids = answer["prompt_ids"]

    def start(self) -> None:
        for arm in self.arms.values():
            arm.start()
        if self.plan.duet and all(arm.process for arm in self.arms.values()):  # live arms, side by side
            self.covered = 0
            self.stand_in = StandIn(self.plan.env())  # held before it starts: an interrupt meanwhile closes it
            if not self.stand_in.start():
                self.stand_in = None
                self.notes.append("side by side without a stand-in (it could not start: see the log): the arm that "
                                  "finished a round last ran its end alone")
            if self.plan.sync:
                self.synced = 0
                if lacking := [arm.label for arm in self.arms.values() if SYNC not in arm.features]:
                    self.notes.append(f"{duet.SYNC_OPTION} on: the worker of {' and '.join(lacking)} cannot start each "
                                      "run of a round with the other arm (its revision predates that): the arms "
                                      "started only each round together")
        self._load_all()

    def restart(self) -> None:
        for arm in self.arms.values():
            arm.restart()
        self._load_all()
        self.restarts += 1

    def close(self, *, ask: bool = True) -> None:
        try:
            if self.stand_in:
                self.stand_in.close(ask=ask)
        finally:
            for arm in self.arms.values():
                arm.close(ask=ask)
                if hasattr(arm, "discard_log"):  # a live worker's log (a replayed arm has none)
                    arm.discard_log()

    def round(self, index: int) -> None:
        """One paired round; measured again (up to MAX_REDOS_PER_ROUND) while the guard sees a disturbance."""
        for attempt in range(MAX_REDOS_PER_ROUND + 1):
            pids = [a.process.pid for a in self.arms.values() if a.process]
            if self.stand_in and self.stand_in.pid:
                pids.append(self.stand_in.pid)  # its work is the gate's own, not a disturbance
            before = self.guard.snapshot(pids)
            self.covering = self.in_step = False
            answers = self._side_by_side(index) if self.plan.duet else self._in_turn(index)
            why = self.guard.disturbance(before, self.guard.snapshot(pids))
            if why is None or attempt == MAX_REDOS_PER_ROUND:
                break
            self.redone += 1
            log.info("%s: round %d disturbed (%s); measuring it again", self.combo.id, index, why)
        if self.covering:
            self.covered += 1
        if self.in_step:
            self.synced += 1
        for name, (answer, core) in answers.items():
            source = f"{self.arms[name].label} round {index + 1}"
            if name == "base":  # only the base may be a newer revision; the candidate's worker is this tree's own
                r, unknown = worker_round(answer, source)
                self.unknown.update(unknown)
            else:
                r = Round.from_json(answer, source)
            self.samples[name].append(r if core is None else dataclasses.replace(r, cpu=core))

    def _in_turn(self, index: int) -> dict[str, tuple[dict[str, Any], int | None]]:
        """Interleaved: one arm's round, then the other's, in a random order."""
        order = list(self.arms)
        self.rng.shuffle(order)
        return {name: (self.arms[name].request({"op": "round", "index": index}), None) for name in order}

    def _side_by_side(self, index: int) -> dict[str, tuple[dict[str, Any], int | None]]:
        """Duet: both arms' rounds at once, each on its core for this round; the first to finish is
        replaced on its core by the stand-in until the other finishes (harness/perf/ab/standin.py).
        With --perf-duet-sync on and both workers able, each run of the round starts together (_in_step)."""
        cores = self._pin(index)
        base, candidate = self.arms.values()
        live = base.process is not None and candidate.process is not None  # recorded arms have no process to move
        in_step = live and self.synced is not None and all(SYNC in arm.features for arm in self.arms.values())
        for arm in self.arms.values():
            arm.send({"op": "round", "index": index, **({"sync": True} if in_step else {})})
        swapping = (self.swapping_class((base.process.pid, candidate.process.pid), (cores["base"], cores["candidate"]),
                                  self.plan.swap_s) if self.plan.swap_s and live else contextlib.nullcontext())
        deadline = time.monotonic() + base.timeout_s if live else None  # one round's time, both arms together

        def left() -> float | None:
            return max(0.1, deadline - time.monotonic()) if deadline is not None else None

        try:
            with swapping:
                if in_step:
                    answers = self._in_step(index, {name: swapping if self.plan.swap_s else cores[name]
                                                    for name in self.arms}, left)
                    return {name: (answers[name], cores[name]) for name in self.arms}
                if live and self.stand_in and self.covers(index):
                    first = first_to_answer([base, candidate], left())
                    if first is not None:
                        name = "base" if first is base else "candidate"
                        where = swapping if self.plan.swap_s else cores[name]
                        self.covering = self.stand_in.cover(first.process.pid, where)
                return {name: (arm.receive("round", timeout_s=left()), cores[name]) for name, arm in self.arms.items()}
        finally:
            if self.stand_in:
                self.stand_in.rest()

    def _in_step(self, index: int, where: dict[str, Any], left: Callable[[], float | None]) -> dict[str, dict[str, Any]]:
        """Both arms' round with each run started together: after every run but the last, a worker says
        so and waits; the first to get there has the stand-in on its core until the other does too,
        then both are told to go on. Without it a slower arm falls behind within the round, and each
        arm's later runs meet the other's in another mode (docs/perf-gate.md, "The arms in step
        within a round"). `where`: each arm's place for the stand-in (the exchange, or its core)."""
        finals: dict[str, dict[str, Any]] = {}
        waiting: dict[str, int] = {}  # arm -> runs done, at the barrier
        covered: str | None = None
        met, runs = 0, None  # barriers both arms reached; the runs of the round, as the workers say
        while len(finals) < len(self.arms):
            running = [arm for name, arm in self.arms.items() if name not in finals and name not in waiting]
            arm = first_to_answer(running, left()) or running[0]  # none in time: receive() says so
            name = arm.name
            answer = arm.receive("round", timeout_s=left())
            if "between" in answer:
                waiting[name], runs = answer["between"], answer.get("of")
            else:
                finals[name] = answer
            if len(waiting) + len(finals) < len(self.arms):  # the other arm still runs: take this one's core
                if covered is None and self.stand_in and self.covers(index):
                    covered = name if self.stand_in.cover(arm.process.pid, where[name]) else None
                    self.covering = self.covering or covered is not None
                continue
            if waiting and (finals or len(set(waiting.values())) > 1):
                for each in self.arms.values():
                    each.failed = True  # their logs are kept: the message names them
                raise ArmError(f"{self.combo.id} round {index + 1}: the arms' rounds differ in their runs (runs done "
                               f"by the arms that wait: {waiting}; finished: {sorted(finals)}; logs: "
                               f"{', '.join(str(a.log_path) for a in self.arms.values())})")
            if covered is not None:
                self.stand_in.release(self.arms[covered].process.pid, where[covered])
                covered = None
            for name in list(waiting):
                self.arms[name].send({"op": "go"})
            met += bool(waiting)
            waiting.clear()
        self.in_step = runs is not None and met == runs - 1  # every run but the first started together
        return finals

    def stand_in_note(self, rounds: int) -> str | None:
        """Where the stand-in started but covered fewer of the `rounds` kept than it was to: how many (the
        log says why: it ended, or could not take a core)."""
        due = sum(self.covers(i) for i in range(rounds))
        if self.stand_in is None or self.covered is None or self.covered >= due:  # none started: said already
            return None
        return (f"the stand-in covered {self.covered} of {due} rounds (see the log for why): in the others the "
                "arm that finished last ran its end alone")

    def covers(self, index: int) -> bool:
        """Whether the stand-in covers a finished arm in round `index` (always; a study may choose)."""
        return True

    def compared_phases(self) -> list[str]:
        """The gated phases (GATED_PHASES) both arms report, with a positive cost, in every round."""
        rounds = self.samples["base"] + self.samples["candidate"]
        return [p for p in GATED_PHASES if rounds and all((v := r.phase_ms(p)) is not None and v > 0 for r in rounds)]

    def ratios(self) -> dict[str, list[float]]:
        """Per metric, per round: candidate / base for the tokens/s metrics, base / candidate for
        the phases' costs, so that below 1 is slower for both."""
        pairs = list(zip(self.samples["base"], self.samples["candidate"]))
        out = {m: [c.metric(m) / b.metric(m) for b, c in pairs] for m in METRICS}
        out.update({p: [b.phase_ms(p) / c.phase_ms(p) for b, c in pairs] for p in self.compared_phases()})
        return out

    def decisions(self, at_cap: bool) -> dict[str, paired.PairedDecision]:
        ratios = self.ratios()
        design = self.ab.design(self.settings, metrics=len(ratios))
        return {m: paired.decide(m, r, design, at_cap=at_cap, cost=m in GATED_PHASES) for m, r in ratios.items()}

    def phase_note(self) -> str | None:
        """One line naming the gated phases the arms could not compare, and the phases the base's
        worker reported that this revision does not know, if any, and why."""
        missing = [p for p in GATED_PHASES if p not in self.compared_phases()]
        if not missing and not self.unknown:
            return None

        def newer(name: str) -> bool:
            return name == "base" and bool(self.unknown)

        parts = []
        silent = [name for name, rounds in self.samples.items() if rounds and not all(r.phases for r in rounds)]
        if missing and silent:
            older = [n for n in silent if not newer(n)]
            whys = []
            if older:
                whys.append(f"the {' and '.join(older)} arm's worker does not report phases (an older revision, or "
                            "untimed: a GPU)")
            if "base" in silent and newer("base"):
                whys.append("the base arm's worker reports none this revision knows (a newer revision)")
            parts.append(f"phases not compared: {', '.join(missing)}: {'; '.join(whys)}")
        elif missing:
            has = {name: {p for p in missing if all(p in r.phases for r in rounds)} for name, rounds in self.samples.items()}
            reasons = []
            for name in self.samples:
                lacking = [p for p in missing if p not in has[name] and any(p in h for h in has.values())]
                if lacking:
                    age = "a newer" if newer(name) else "an older"
                    reasons.append(f"{', '.join(lacking)}: the {name} arm's worker does not report them ({age} revision)")
            neither = [p for p in missing if not any(p in h for h in has.values())]
            if neither:
                reasons.append(f"{', '.join(neither)}: not in every round of either arm (a combination without a draft or "
                               "without plain steps, or workers older than the phase)")
            parts.append(f"phases not compared: {'; '.join(reasons)}")
        if self.unknown:
            parts.append(f"phases unknown to this revision, not compared: {', '.join(sorted(self.unknown))} from the base "
                         "arm (its worker is of a newer revision)")
        return "; ".join(parts) + "; decided on what both arms report"

    def counter_differences(self) -> list[str]:
        if self.combo.decoding != "greedy":
            return []
        base, cand = self.samples["base"][0].counters, self.samples["candidate"][0].counters
        return [f"{prompt}: base {base.get(prompt)}, candidate {cand.get(prompt)}"
                for prompt in sorted(set(base) | set(cand)) if base.get(prompt) != cand.get(prompt)]

    def run(self, progress: Callable[[int, dict[str, paired.PairedDecision] | None], None] | None = None) -> ABResult:
        s = self.settings
        try:
            self.start()
            index, decisions, cut_short = 0, None, False
            while True:
                look = min(s.rounds if index < s.rounds else index + s.batch, s.max_rounds)
                while index < min(look, self.cap):
                    if index and index % self.ab.restart_every == 0:
                        self.restart()
                    self.round(index)
                    index += 1
                    if progress:
                        progress(index, decisions)
                if index < look:  # a recording that ends before this look: decided at its end, as at a cap
                    decisions, cut_short = standing(decisions, self.decisions(at_cap=True)), True
                    break
                decisions = standing(decisions, self.decisions(at_cap=index >= s.max_rounds))
                if index >= s.max_rounds or _settled(decisions, self.ab.suspect_z):
                    break
        except BaseException:  # an error or an interrupt: a worker mid-request is killed, not asked to quit
            self.close(ask=False)
            raise
        self.close()
        short = (f"the recording ends after {index} rounds, before the gate decided: what was still inconclusive "
                 "is UNDECIDED, as at a cap") if cut_short else None
        notes = self.notes + [n for n in (self.stand_in_note(index), self.phase_note(), located(decisions, index),
                                          short) if n]
        environments = {name: arm.environment for name, arm in self.arms.items()}
        return ABResult(self.combo.id, self.described("base"), self.described("candidate"), decisions,
                        self.ratios(), index, self.redone, self.restarts, self.samples, self.plan.mode,
                        self.counter_differences(), notes=notes,
                        environments=environments if all(environments.values()) else None,
                        swap_s=self.plan.swap_s, cut_short=cut_short, stand_in_rounds=self.covered,
                        synced_rounds=self.synced)

    def described(self, name: str) -> str:
        """An arm as results name it: its revision and commit, and its environment where it has its own."""
        arm = self.arms[name]
        own, other = arm.environment, self.arms["candidate" if name == "base" else "base"].environment
        where = f" in {own.label}" if own and other and own.python != other.python else ""
        return f"{arm.tree.label} {arm.tree.commit[:12]}{where}"


def gating(decisions: dict[str, paired.PairedDecision]) -> list[Outcome]:
    """The verdicts that make a combination's outcome: every tokens/s metric's, and a phase's only
    when it regressed. A phase can fail the gate (a slower phase costs users time) but never makes
    it UNDECIDED: its passes spread more than tokens/s under a noisy host (docs/perf-gate.md), and
    an unsettled phase would turn gates UNDECIDED that tokens/s had decided."""
    return [d.verdict for m, d in decisions.items()
            if m in METRICS or (m in GATED_PHASES and d.verdict == Outcome.REGRESSION)]


def suspect(d: paired.PairedDecision, z: float = 0.0) -> bool:
    """A phase not yet significant whose estimate is already slower than the regression threshold
    (and, with `z`, that many standard errors slower than no change): the gate goes on looking (up to
    its cap) rather than pass it."""
    beyond = d.cost and d.verdict == Outcome.INCONCLUSIVE and 1 + d.change < 1 - d.tolerance / 2
    return beyond and (z <= 0 or -math.log(1 + d.change) > z * d.se)


def suspects(decisions: dict[str, paired.PairedDecision], z: float = 0.0) -> list[str]:
    """The phases that keep the gate looking: each `suspect`, except a wall-clock phase whose CPU-time
    twin (phases.CPU_TIME_OF) is decided beside it. Work that grew shows in both; a neighbour
    holding the core during or between passes only in the wall clock, where a phase spreads up to
    four times as much a round under a noisy host (docs/perf-gate.md, "Which phase keeps the gate
    looking"). Such a wall-clock phase still fails the gate once significant."""
    return [m for m, d in decisions.items() if suspect(d, z) and phases.CPU_TIME_OF.get(m) not in decisions]


def _settled(decisions: dict[str, paired.PairedDecision], suspect_z: float = 0.0) -> bool:
    """The gate may stop: a phase regressed (the slowdown is found and named), or tokens/s settled
    (a regression among them too) and no phase is one of the `suspects`. So a tokens/s regression
    whose phase is still a suspect keeps the gate looking, up to its cap, to name the phase; its call
    stands (`standing`)."""
    if any(d.cost and d.verdict == Outcome.REGRESSION for d in decisions.values()):
        return True
    return settled(gating(decisions)) and not suspects(decisions, suspect_z)


def standing(earlier: dict[str, paired.PairedDecision] | None,
             now: dict[str, paired.PairedDecision]) -> dict[str, paired.PairedDecision]:
    """This look's decisions, except that a REGRESSION called at an earlier look stands. The
    false-alarm family already spends its alpha on every look, so a call made at any look is made at
    the stated rate; the looks after it only locate the phase, and must not take the call back."""
    if not earlier:
        return now
    return {m: earlier[m] if m in earlier and earlier[m].verdict == Outcome.REGRESSION
            and d.verdict != Outcome.REGRESSION else d for m, d in now.items()}


def located(decisions: dict[str, paired.PairedDecision], rounds: int) -> str | None:
    """One line where a regression was called before the gate's last look: the gate went on only to
    name the phase."""
    early = [m for m, d in decisions.items() if d.verdict == Outcome.REGRESSION and d.rounds < rounds]
    if not early:
        return None
    at = min(decisions[m].rounds for m in early)
    named = [m for m, d in decisions.items() if d.cost and d.verdict == Outcome.REGRESSION]
    found = f"called slower: {', '.join(named)}" if named else "none became significant"
    return (f"{', '.join(early)} regressed after {at} rounds; the gate went on to {rounds} rounds only to locate the "
            f"slowdown, as a phase read slower than the threshold but was not yet significant; {found}")
