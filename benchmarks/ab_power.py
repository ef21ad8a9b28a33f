"""How well does the A/B gate tell a slower commit from noise on this machine?

Runs whole A/B gates (harness/perf/ab/gate.py) of the working tree against a base revision, with a
slowdown planted in the candidate's target forward pass (0 = A/A) or, as draft:F, in its draft's
forward only (likewise verify:F, glue:F; glue:5ms sizes F to plant 5 ms a step on the CPU that runs
it), or as env:F in a copy of transformers whose decoder layers
are F slower, installed in an overlay of this environment that the candidate arm runs in (env:0: the
unchanged copy, two environments that differ in one package only; harness/perf/plant_package.py), and
records each finished gate (both arms' rounds) to a JSON-lines file, so an
interrupted run resumes where it stopped. Each row names the host condition (quiet, or noisy under
benchmarks/noisy_host.py), the arms' mode, the CPU class and the CPU's model name and generation
(family and model numbers: one "AMD EPYC" may be Zen 3, 4 or 5). Then prints, per level: detection
(REGRESSION) and false-alarm rates, UNDECIDED, rounds and minutes per gate; and the same rates over
--trials gates replayed through the gate's own code on the kept A/A rounds resampled by worker pair
(harness/perf/replay.py), each level's measured shift applied to every metric and gated phase, for rates
tighter than real gates give.

    python benchmarks/ab_power.py --pair smollm2-135m+self --levels 0,0.10 --gates 5
    python benchmarks/ab_power.py --pair qwen-coder-1.5b+0.5b --levels 0,0.10,draft:0.20 --gates 20   # hours
    python benchmarks/ab_power.py --pair qwen-coder-1.5b+0.5b --levels env:0,env:0.10 --gates 10      # across envs
    python benchmarks/noisy_host.py -- python benchmarks/ab_power.py --levels 0,0.10 --gates 20     # noisy
    python benchmarks/ab_power.py --gates 0 --out benchmarks/data/ab_power_avx512-bf16_duet_quiet.jsonl \
        --pair qwen-coder-1.5b+0.5b --levels 0,0.10 --duet on --cpu "not recorded"   # the tables from kept rows

A file's gates count for the CPU that recorded them (its model name and generation) and no other: one
class covers several CPUs. --cpu reports another's, or those kept before the CPU was recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness.core import termination
from harness.core.cachedir import cache_root
from harness.machine import capability
from harness.workload import registry
from pytest_benchmark.utils import parse_compare_fail

from harness.perf import combinations, plant_package, replay
from harness.perf.plant import PLANT_INTO
from harness.perf.ab import duet, environment, revision
from harness.perf.stored import stats
from harness.perf.outcome import Outcome
from harness.perf.ab.gate import ABGate, ABResult, ABSettings
from harness.perf.ab.arms import Arm
from harness.perf.ab.loadguard import LoadGuard, noise_pids
from harness.perf.combinations import Combination, PerfSettings
from harness.measure import phases
from harness.perf.record import GATED_PHASES, METRICS, Round

REPO = Path(__file__).resolve().parents[1]
ENV = "env"  # a level planted in the candidate's Python environment (a slower copy of transformers)
# Resampled false-alarm rates from fewer worker pairs than this are said to be rough: each pair is then
# a large share of every draw, and 12 and 16 pairs gave 12.0% and 3.0% where no real gate erred
# (docs/gate-power.md, "Gate power: real gates and resampled ones").
MIN_PAIRS = 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="smollm2-135m+self")
    p.add_argument("--against", default="HEAD", help="base revision (default HEAD: the same code, A/A at level 0)")
    p.add_argument("--levels", default="0,0.10",
                   help="slowdowns planted in the candidate's target forward; draft:F plants F into the draft's "
                        "forward only (plain decoding untouched), verify:F into the target's verification passes, "
                        "glue:F as host work before each verification (harness/perf/plant.py), F of the pass, or "
                        "glue:Nms, the F that plants N ms a step on this CPU (sized_level); env:F runs the "
                        "candidate in an overlay environment whose transformers' decoder layers are F slower "
                        "(harness/perf/plant_package.py), e.g. 0,0.10,draft:0.20,env:0")
    p.add_argument("--gates", type=int, default=5, help="real gates per level (0: only the tables from the kept rows)")
    p.add_argument("--tolerance", type=float, default=ABSettings().tolerance)
    p.add_argument("--trials", type=int, default=5000, help="simulated gates per level")
    p.add_argument("--duet", choices=duet.CHOICES, default="auto",
                   help="the gate's --perf-duet: arms side by side (on), in turn (off), auto (side by side on 2 cores)")
    p.add_argument("--duet-swap", type=float, default=duet.SWAP_S, metavar="SECONDS",
                   help=f"the gate's --perf-duet-swap: side by side, the arms exchange cores every SECONDS within a "
                        f"round (default {duet.SWAP_S:g}; 0: between rounds only, as every gate before it)")
    p.add_argument("--duet-sync", action="store_true",
                   help="the gate's --perf-duet-sync on: side by side, both arms start each run of a round together "
                        "(its rows keep synced_rounds; keep them in a file of their own)")
    p.add_argument("--restart-every", type=int, default=ABSettings().restart_every, help="rounds per worker pair")
    p.add_argument("--condition", default=None,
                   help="what else ran on the host, a label kept in each row (default: noisy under "
                        "benchmarks/noisy_host.py, else quiet)")
    p.add_argument("--max-rounds", type=int, default=None, metavar="N",
                   help="the gates' cap on rounds, as --perf-max-repeats sets it (default: the registry's [perf] "
                        "max_rounds); the resampled gates use it too")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="rounds between looks after the first (default: the registry's [perf] batch); the real "
                        "and the resampled gates use it")
    p.add_argument("--out", type=Path, default=Path("results/ab_power.jsonl"), help="finished gates (resumed)")
    p.add_argument("--cpu", default=None, metavar="NAME",
                   help="whose kept gates to count and report: this host's CPU (the default, the only one that takes "
                   f"more gates), '{NOT_RECORDED}' for those kept before the CPU was recorded, or a name as "
                   "docs/gate-power.md's tables give it (\"AMD EPYC, family 26 model 2\")")
    return p.parse_args(argv)


def combination(matrix: registry.Matrix, pair_name: str, settings: PerfSettings) -> Combination:
    """The pair's choice for this CPU class as the merge gate runs it (greedy, CPU; its K and drafting)."""
    return combinations.of_pair(matrix, pair_name, settings, given_by="benchmarks/ab_power.py")


@dataclass(frozen=True)
class PerStep:
    """A level given in ms a step (glue:5ms): host work the plant sizes as a fraction of the verification
    pass (harness/perf/plant.py), so the fraction that plants the ms is the CPU's own (sized_level)."""
    into: str
    ms: float

    def __str__(self) -> str:
        return f"{self.into}:{self.ms:g}ms"


Level = tuple[str, float]  # (where the slowdown is planted, fraction)


def parse_level(text: str) -> Level | PerStep:
    """'0.10' -> ('target', 0.10); 'draft:0.20' -> ('draft', 0.20); likewise verify:F and glue:F
    (--perf-plant-into's places: harness/perf/plant.py PLANT_INTO); 'glue:5ms' -> PerStep('glue', 5.0)."""
    into, _, amount = text.rpartition(":")
    if into == "glue" and amount.endswith("ms"):
        try:
            ms = float(amount.removesuffix("ms"))
        except ValueError:
            ms = math.nan
        if ms > 0 and math.isfinite(ms):
            return PerStep(into, ms)
        raise SystemExit(f"--levels: {text!r}: give glue:Nms with N ms above 0, e.g. glue:5ms")
    try:
        if into in ("", *PLANT_INTO, ENV):
            return into or "target", float(amount)
    except ValueError:
        pass
    raise SystemExit(f"--levels: {text!r}: give F or PLACE:F (a fraction; PLACE one of {', '.join((*PLANT_INTO, ENV))}) "
                     "or glue:Nms (the fraction that plants N ms a step here), e.g. 0,0.10,draft:0.20,glue:5ms")


# A glue level plants its fraction of the verification pass before each one, so the ms it plants follow
# the host's speed, which differs between CPUs and moves from day to day. glue:Nms resumes a level whose
# own gates on this CPU planted at least SIZED of N ms a step, else sizes one by the median pass of this
# CPU's latest SIZING_GATES gates: one command plants the same ms on every CPU.
SIZED, SIZING_GATES = 0.95, 20


def verify_ms(gates: Iterable[dict]) -> float | None:
    """The median verification pass of the gates' unchanged arm (the base), in ms: a glue level plants
    its fraction of this a step; None where no gate timed its phases."""
    times = [phases["verify"]["median_ms"] for g in gates for phases in (g.get("phases") or {}).get("base", [])
             if phases and "verify" in phases]
    return statistics.median(times) if times else None


def latest_pass(gates: Iterable[dict]) -> float | None:
    """The median verification pass (ms) of the latest SIZING_GATES of these gates (in the order given)
    that timed one: the pass a new glue level is sized by, as close to the host's speed today as the gates go."""
    timed = [g for g in gates if verify_ms([g]) is not None]
    return verify_ms(timed[-SIZING_GATES:])


def glue_ms(level: Level, verify: float | None) -> float | None:
    """The ms a glue level plants a step on a verification pass of `verify` ms; None for other levels
    or where no gate timed one."""
    into, fraction = level
    return fraction * verify if into == "glue" and fraction and verify else None


def plants(level: Level, verify: float | None, ms: float) -> bool:
    """The level plants at least SIZED of `ms` a step on a verification pass of `verify` ms."""
    return (glue_ms(level, verify) or 0.0) >= SIZED * ms


def fraction_planting(ms: float, verify: float) -> float:
    """The smallest fraction, in steps of 0.1%, that plants `ms` on a verification pass of `verify` ms."""
    return math.ceil(1000 * ms / verify - 1e-9) / 1000


def sized_level(level: PerStep, done: list[dict], timed: list[dict]) -> Level | None:
    """The fraction glue:Nms plants on this CPU: the kept level of its gates (`done`: this CPU's, at this
    tolerance and looks) whose own gates planted at least SIZED of N ms a step, the one with the most
    gates (a level keeps its gates though the host's speed moves); else the smallest that plants N ms on
    the latest pass of `timed` (this CPU's gates in the file, in the order kept: latest_pass); None
    where none of them timed a pass yet."""
    kept: dict[Level, list[dict]] = {}
    for g in done:
        if level_of(g)[0] == level.into and g["level"]:
            kept.setdefault(level_of(g), []).append(g)
    holding = [lv for lv, gates in kept.items() if plants(lv, verify_ms(gates), level.ms)]
    if holding:
        return max(holding, key=lambda lv: len(kept[lv]))
    verify = latest_pass(timed)
    return (level.into, fraction_planting(level.ms, verify)) if verify else None


class Sizes:
    """The levels a run asks for as fractions: one in ms a step (glue:5ms) sized once on this CPU
    (sized_level) from its gates in the file, `done` and `same` (main's lists, which grow as gates finish)."""

    def __init__(self, done: list[dict], same: list[dict], cpu: str, out: Path):
        self.done, self.same, self.cpu, self.out = done, same, cpu, out
        self.sized: dict[PerStep, Level] = {}

    def of(self, level: Level | PerStep) -> Level | None:
        """The level as a fraction; None for one in ms until a gate here timed a verification pass."""
        if not isinstance(level, PerStep):
            return level
        if level not in self.sized and (got := sized_level(level, self.done, self.same)):
            self.sized[level] = got
            own = [g for g in self.done if level_of(g) == got]
            print(f"{level}: {label(got)} of the verification pass on {self.cpu} ("
                  + (f"its level with {len(own)} kept gates, " if own else "")
                  + f"{glue_ms(got, verify_ms(own) or latest_pass(self.same)):.1f} ms a step)", file=sys.stderr, flush=True)
        return self.sized.get(level)

    def to_run(self, level: Level | PerStep) -> Level:
        """The level a gate plants now; SystemExit naming --levels where it cannot be sized yet."""
        got = self.of(level)
        if got is None:
            raise SystemExit(f"--levels {level}: no gate of this setup on {self.cpu} in {self.out} timed a verification "
                             "pass to size it by: put 0 before it in --levels (an A/A gate times one), or give glue:F")
        return got

    def known(self, levels: list[Level | PerStep]) -> list[Level]:
        """The levels as fractions for the report, saying which could not be sized yet."""
        unsized = [str(level) for level in levels if self.of(level) is None]
        if unsized:
            print(f"{', '.join(unsized)}: not sized on {self.cpu} yet: no gate of this setup here timed a "
                  "verification pass", file=sys.stderr)
        return [got for level in levels if (got := self.of(level)) is not None]


def level_of(row: dict) -> Level:
    return row.get("into", "target"), row["level"]


def label(level: tuple[str, float]) -> str:
    """'glue 1.7%', 'target 10%': a fraction as given, not rounded to a whole percent."""
    return f"{level[0]} {100 * level[1]:.3g}%"


def has_stand_in(row: dict) -> bool:
    """The gate ran side by side with the stand-in (harness/perf/ab/duet.py), even if it could not start
    it (`stand_in_rounds` 0); rows kept before 2026-12-02 have no count."""
    return row.get("stand_in_rounds") is not None


def synced(row: dict) -> bool:
    """The gate was asked to start each run of a round in both arms together (--duet-sync); rows where
    the base's worker could not (`synced_rounds` 0) are not kept."""
    return row.get("synced_rounds") is not None


def takes_gates(mode: str, stand_in: bool) -> bool:
    """Whether this script still adds gates to kept gates of this arms' mode that ran with (or without)
    the stand-in: side by side always has it now, so gates side by side without it are kept as
    measured, never mixed with new ones."""
    return mode != "duet" or stand_in


def candidate_environment(fraction: float, here: environment.Environment) -> environment.Environment:
    """env:F: an overlay of this environment with transformers copied, its decoder layers F slower
    (F = 0: unchanged), built once into the cache (harness/perf/ab/environment.py)."""
    wheel = plant_package.transformers_wheel(cache_root() / "planted-wheels", fraction)
    return environment.build(str(wheel), here, say=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
                             label=f"the candidate's environment (env:{fraction:g}, {wheel.name})")


def looks_of(settings: PerfSettings) -> dict[str, int]:
    """When a gate looks: first after `rounds`, then every `batch`, up to `max_rounds`. Kept in each row,
    so that gates run with --batch or --max-rounds are not counted with those of the registry's."""
    return {"rounds": settings.rounds, "batch": settings.batch, "max_rounds": settings.max_rounds}


def same_looks(gate: dict, settings: PerfSettings) -> bool:
    """A kept gate ran with these settings' looks (a row from before rows kept them counts as such)."""
    return gate.get("looks", looks_of(settings)) == looks_of(settings)


def load_requests(matrix, combo, settings, plant: dict | None = None):
    """Each arm's load request (arm name -> request), `plant` ({"fraction", "into"}) in the candidate's only."""
    def request(arm: str) -> dict:
        return {"op": "load", "matrix": str(matrix.path), "combination": combo.as_request(),
                "settings": dataclasses.asdict(settings), "plant": plant if arm == "candidate" else None}
    return request


def run_gate(matrix, combo, settings, trees, level, tolerance, seed, plan, restart_every, noise, into="target",
             environments=None, gate_class: type[ABGate] = ABGate) -> dict:
    base, candidate = trees
    base_env, candidate_env = environments or (None, None)
    planted = level and into != ENV  # env:F is planted in the candidate's environment, not by its worker
    load_request = load_requests(matrix, combo, settings, {"fraction": level, "into": into} if planted else None)
    start = time.perf_counter()

    def progress(done: int, decisions) -> None:
        print(f"  round {done} ({(time.perf_counter() - start) / 60:.1f} min)", file=sys.stderr, flush=True)

    ab = ABSettings(tolerance=tolerance, seed=seed, restart_every=restart_every)
    result = gate_class(combo, settings, Arm("base", base, env=plan.env(), environment=base_env),
                        Arm("candidate", candidate, env=plan.env(), environment=candidate_env),
                        load_request, ab, guard=LoadGuard(noise=noise), plan=plan).run(progress)
    if result.synced_rounds == 0:
        raise SystemExit(f"--duet-sync: {'; '.join(result.notes)}: its gates would not be the setup --duet-sync names, "
                         "so none is kept")
    return {"level": level, "into": into, "tolerance": tolerance, "outcome": result.outcome.value, "rounds": result.rounds, "redone": result.redone,
            "restart_every": ab.restart_every, "looks": looks_of(settings), "mode": result.mode, "swap_s": result.swap_s,
            "stand_in_rounds": result.stand_in_rounds, "synced_rounds": result.synced_rounds,
            "cpu_class": matrix.cpu_class,
            "cpu": host_cpu(),
            # when and on what code: a file's rows are then a history of the gate on this host
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "trees": {arm: {"commit": tree.commit, "label": tree.label} for arm, tree in zip(("base", "candidate"), trees)},
            "minutes": (time.perf_counter() - start) / 60, "ratios": result.ratios,
            "arms": {arm: {m: [s.metric(m) for s in samples] for m in METRICS} for arm, samples in result.samples.items()},
            "phases": replay.power_row_phases(result.samples),
            "verdicts": {m: d.verdict.value for m, d in result.decisions.items()},
            "environments": {name: list(pair) for name, pair in result.environment_changes.items()},
            "cores": {arm: [s.cpu for s in samples] for arm, samples in result.samples.items()},
            # each arm's CPU and wall seconds per round: how much of its core it got (a neighbour's share)
            "cpu_s": {arm: [s.cpu_s for s in samples] for arm, samples in result.samples.items()},
            "wall_s": {arm: [s.wall_s for s in samples] for arm, samples in result.samples.items()},
            # each arm's page faults per round: memory its generating thread touched for the first time
            "page_faults": {arm: [s.page_faults for s in samples] for arm, samples in result.samples.items()}}


def study_arguments(p: argparse.ArgumentParser, rounds: int, multiple: int) -> None:
    """The options the study scripts share: --level, --rounds (`rounds` by default, a multiple of
    `multiple`), --out and --show; check_study_arguments() checks them once parsed."""
    p.add_argument("--level", type=float, default=0.0, metavar="FRACTION",
                   help="the candidate's target forward this much slower (default 0: an A/A gate)")
    p.add_argument("--rounds", type=int, default=rounds,
                   help=f"rounds of the gate, all run (a multiple of {multiple}, at least 4)")
    p.add_argument("--out", type=Path, required=True, help="JSON lines: one row a gate, appended")
    p.add_argument("--show", action="store_true", help="print the kept rows only")
    p.set_defaults(rounds_multiple=multiple)


def check_study_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rounds < 4 or args.rounds % args.rounds_multiple:
        p.error(f"--rounds {args.rounds}: a multiple of {args.rounds_multiple}, at least 4")
    if not 0 <= args.level < 1:
        p.error(f"--level {args.level:g}: a fraction from 0 (A/A) to below 1")


def study_gate(pair: str, rounds: int, level: float, plan: duet.Plan, gate_class: type[ABGate]) -> dict:
    """One gate of exactly `rounds` rounds (its first look at the last) of HEAD against the working
    tree, the candidate's target forward `level` slower, for the study scripts (duet_swap.py,
    duet_standin.py): run_gate's row with its combination and host condition."""
    matrix = registry.load_matrix()
    settings = dataclasses.replace(PerfSettings.from_matrix(matrix), rounds=rounds, max_rounds=rounds)
    combo = combination(matrix, pair, settings)
    repo = revision.repository_root(REPO)
    trees = (revision.checkout(repo, "HEAD"), revision.working_tree(repo))
    noise = noise_pids()
    row = run_gate(matrix, combo, settings, trees, level, 0.10, seed=0, plan=plan, restart_every=4, noise=noise,
                   gate_class=gate_class)
    return {"combination": combo.id, "condition": "noisy" if noise else "quiet", **row}


def kept_rows(out: Path, row: dict | None) -> list[dict]:
    """Append `row` (if any) to the JSON lines file `out`; every row it keeps. SystemExit naming the
    file where there is none."""
    if row is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
    if not out.exists():
        raise SystemExit(f"--out {out}: no such file; run without --show first")
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def shifts(done: list[dict], level: tuple[str, float]) -> dict[str, float] | None:
    """The factor a planted level moves each of the candidate's metrics and gated phases by, as the
    gate's ratios go (below 1: slower; a phase's cost is divided by it): measured (the mean per-round
    log ratio of this level's real gates) where there are any, a phase in CPU time that those gates
    did not record moved as its wall clock did (a pass costs CPU time as it costs wall time); else
    nominal for a target slowdown (plain and assisted tokens/s and the target's passes 1/(1+L), the
    rest left alone); None when nothing says."""
    gates = [g for g in done if level_of(g) == level]
    into, fraction = level
    if not fraction and into != ENV:
        return {m: 1.0 for m in (*METRICS, *GATED_PHASES)}
    if gates:
        def mean_ratio(name: str) -> float:
            return math.exp(statistics.fmean(math.log(r) for g in gates for r in g["ratios"][name]))
        measured = {m: mean_ratio(m) for m in (*METRICS, *(p for p in GATED_PHASES if all(p in g["ratios"] for g in gates)))}
        return {**{cpu: measured[wall] for wall, cpu in phases.CPU_TIME_OF.items() if wall in measured}, **measured}
    if into == "target":
        slower = 1 / (1 + fraction)
        unmoved = {m: 1.0 for m in (*METRICS, *GATED_PHASES)}
        return {**unmoved, "plain_tokens_per_sec": slower, "assisted_tokens_per_sec": slower,
                **{p: slower for wall in (phases.TARGET_STEP, phases.VERIFY) for p in (wall, phases.CPU_TIME_OF[wall])}}
    return None


def moved(r: Round, shift: dict[str, float]) -> Round:
    """A candidate round moved by `shift`: each metric times its factor, each gated phase's cost
    divided by its factor; without phases where `shift` does not say how every gated phase the round
    has moved (the resampled gate then decides on the metrics alone, as against an older worker)."""
    kept = None
    if r.phases is not None and all(p in shift for p in GATED_PHASES if p in r.phases):
        kept = {name: cost if name not in GATED_PHASES else
                phases.PhaseCost(cost.calls, *(v / shift[name] for v in (cost.total_ms, cost.median_ms, cost.low_ms)))
                for name, cost in r.phases.items()}
    return dataclasses.replace(r, **{m: r.metric(m) * shift[m] for m in METRICS}, phases=kept)


def resampled_gates(aa: list[dict], shift: dict[str, float], combo: Combination, settings: PerfSettings,
                    ab: ABSettings, trials: int, rng: random.Random) -> Iterator[ABResult]:
    """Gates replayed through the gate's own code (harness/perf/replay.py) on A/A rounds resampled by
    worker pair: blocks of `restart_every` consecutive rounds (one worker pair's) drawn with
    replacement, so that the spread between worker pairs stays in; the candidate's rounds moved by
    `shift` (`moved`), so that the gated phases are decided and counted in the false-alarm budget
    as in a live gate."""
    blocks = []
    for g in aa:
        base, cand, every = replay.power_row_rounds(g, "base"), replay.power_row_rounds(g, "candidate"), g.get("restart_every", ab.restart_every)
        moved_cand = [moved(c, shift) for c in cand]  # once per row, not once per draw
        blocks += [list(zip(base[i:i + every], moved_cand[i:i + every])) for i in range(0, len(base), every)]
    for _ in range(trials):
        pairs: list = []
        while len(pairs) < settings.max_rounds:
            pairs += rng.choice(blocks)
        pairs = pairs[:settings.max_rounds]
        yield replay.ab_gate(combo, settings, ab, replay.RecordedArm("base", "A/A resampled", [b for b, _ in pairs]),
                             replay.RecordedArm("candidate", "A/A resampled", [c for _, c in pairs])).run()


def simulate(aa: list[dict], shift: dict[str, float], combo: Combination, settings: PerfSettings, ab: ABSettings,
             trials: int, rng: random.Random) -> dict[str, float]:
    """The share of `resampled_gates` that call a regression or end UNDECIDED, and their mean rounds."""
    counts = {"regression": 0, "undecided": 0, "rounds": 0}
    for result in resampled_gates(aa, shift, combo, settings, ab, trials, rng):
        counts["regression"] += result.outcome == Outcome.REGRESSION
        counts["undecided"] += result.outcome == Outcome.UNDECIDED
        counts["rounds"] += result.rounds
    return {k: v / trials for k, v in counts.items()}


def host_cpu() -> dict[str, str]:
    """Which host of the class: one model name may cover several generations (an "AMD EPYC" VM)."""
    return {"model": capability.cpuinfo()[0], "generation": capability.cpu_generation()}


def host_of(row: dict) -> str | None:
    """The CPU a kept gate ran on ("AMD EPYC, family 26 model 2"): its model name and generation; None for
    rows kept before it was recorded; UNKNOWN_CPU where the host's CPU named nothing (never one of those).
    Gates on other CPUs are other gates: counted, pooled and tabled apart."""
    cpu = row.get("cpu")
    return ", ".join(filter(None, (cpu.get("model"), cpu.get("generation")))) or UNKNOWN_CPU if cpu else None


def main(argv=None) -> int:
    args = parse_args(argv)
    noise = noise_pids()  # a noisy neighbour's load (benchmarks/noisy_host.py), counted as the gates' own
    args.condition = args.condition or ("noisy" if noise else "quiet")
    matrix = registry.load_matrix()
    settings = PerfSettings.from_matrix(matrix)
    combo = combination(matrix, args.pair, settings)
    if args.max_rounds is not None:
        if args.max_rounds < settings.rounds:
            raise SystemExit(f"--max-rounds {args.max_rounds}: at least the first look's {settings.rounds} rounds")
        settings = dataclasses.replace(settings, max_rounds=args.max_rounds)
    if args.batch is not None:
        if args.batch < 1:
            raise SystemExit(f"--batch {args.batch}: at least 1 round between looks")
        settings = dataclasses.replace(settings, batch=args.batch)
    levels = [parse_level(x) for x in args.levels.split(",")]
    try:
        plan = duet.plan(args.duet, swap_s=args.duet_swap, sync=args.duet_sync)
    except duet.DuetError as exc:
        raise SystemExit(str(exc).replace("--perf-duet", "--duet")) from None
    kept = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    setup = same_setup(kept, combo.id, plan, args.condition, matrix.cpu_class)
    cpu = chosen_cpu(args.cpu, host_of({"cpu": host_cpu()}), args.gates)
    same = on_host(setup, cpu)
    if not same and setup:
        held = sorted({host_of(g) or NOT_RECORDED for g in setup})
        print(f"{args.out}: no kept gates of this setup on {cpu or NOT_RECORDED}; it holds some of: "
              + "; ".join(held) + " (--cpu NAME reports those)", file=sys.stderr)
    done = [g for g in same if g.get("tolerance", ABSettings().tolerance) == args.tolerance
            and same_looks(g, settings)]
    if args.gates and not all(takes_gates(plan.mode, has_stand_in(g)) for g in setup):
        raise SystemExit(f"{args.out}: holds gates side by side without the stand-in (kept before 2026-12-02); "
                         "side by side has it now, so its gates go to a file of their own: give another --out (the "
                         "commands under docs/gate-power.md's tables name it)")
    if args.gates:
        here = environment.current()
        repo = revision.repository_root(REPO)
        trees = (revision.checkout(repo, args.against), revision.working_tree(repo))
        args.out.parent.mkdir(parents=True, exist_ok=True)
    sizes = Sizes(done, same, cpu or NOT_RECORDED, args.out)
    for i in range(args.gates):  # levels interleaved, so a slow hour of the machine hits every level
        for level in map(sizes.to_run, levels):  # lazily: a level in ms is sized when first reached
            if sum(level_of(g) == level for g in done) > i:
                continue
            into, fraction = level
            print(f"[{combo.id}] {label(level)}: gate {i + 1}/{args.gates}", file=sys.stderr, flush=True)
            envs = (here, candidate_environment(fraction, here)) if into == ENV else None
            gate = {"combination": combo.id, "condition": args.condition,
                    **run_gate(matrix, combo, settings, trees, fraction, args.tolerance, seed=i, plan=plan,
                               restart_every=args.restart_every, noise=noise, into=into, environments=envs)}
            with open(args.out, "a", encoding="utf-8") as fh:  # one line per finished gate: resumable
                fh.write(json.dumps(gate) + "\n")
            done.append(gate)
            same.append(gate)
            print(f"  {gate['outcome']} after {gate['rounds']} rounds, {gate['minutes']:.1f} min", file=sys.stderr)
    levels = sizes.known(levels)
    report(done, [g for g in same if not g["level"] and g.get("into") != ENV], levels, combo, settings, plan, args)
    compare_gates(done, levels, settings, args.tolerance)
    return 0


def same_setup(kept: list[dict], combination: str, plan: duet.Plan, condition: str, cpu_class: str) -> list[dict]:
    """The kept gates of this combination, arms' mode, host condition and CPU class, on any CPU."""
    return [g for g in kept if g.get("combination") == combination and g.get("mode", "interleaved") == plan.mode
            and g.get("swap_s") == plan.swap_s and synced(g) == (plan.sync and plan.duet)
            and g.get("condition", "quiet") == condition and g.get("cpu_class", cpu_class) == cpu_class]


NOT_RECORDED = "not recorded"  # --cpu: the gates kept before the CPU was recorded
UNKNOWN_CPU = "an unknown CPU"  # a host whose CPU names nothing: its gates never count as unrecorded ones


def chosen_cpu(choice: str | None, here: str | None, gates: int) -> str | None:
    """Whose kept gates a run counts and reports (--cpu): this host's unless named; gates run only here."""
    cpu = here if choice is None else None if choice == NOT_RECORDED else choice
    if gates and cpu != here:
        raise SystemExit(f"--cpu {choice}: this host is {here}, and gates run on it alone: give --gates 0 to report "
                         "another CPU's kept gates")
    return cpu


def on_host(gates: list[dict], cpu: str | None) -> list[dict]:
    """The gates of one CPU (host_of): those a run there counts on (at its tolerance) and whose A/A rounds
    its resampled gates draw from. One class covers several CPUs (an "AMD EPYC" VM may be a Zen 4 or a
    Zen 5), so a gate counts for the CPU it recorded and no other; one kept before the CPU was recorded
    counts for none but `None` (--cpu "not recorded"; docs/gate-power.md's tables show those apart)."""
    return [g for g in gates if host_of(g) == cpu]


def worker_pairs(gates: list[dict], restart_every: int) -> int:
    """How many worker pairs ran these gates' rounds (each gate started one, then one every
    `restart_every` rounds): the blocks the resampled gates draw from, as `simulate` cuts them."""
    return sum(-(-g["rounds"] // g.get("restart_every", restart_every)) for g in gates)


def time_split(gates: list[dict]) -> tuple[float, float] | None:
    """Where the real gates' minutes went: (seconds a round spends measuring, the slower arm's wall
    time; seconds a worker start or restart takes, both arms loading and warming up), over the gates
    that kept each round's wall time. A redone round is counted at the mean round's time."""
    kept = [g for g in gates if g.get("wall_s") and g["rounds"]]
    if not kept:
        return None
    rounds = sum(g["rounds"] for g in kept)
    measuring = sum(max(b, c) for g in kept for b, c in zip(g["wall_s"]["base"], g["wall_s"]["candidate"]))
    per_round = measuring / rounds
    starts = worker_pairs(kept, ABSettings().restart_every)
    loading = sum(g["minutes"] * 60 for g in kept) - measuring - per_round * sum(g.get("redone", 0) for g in kept)
    return per_round, loading / starts


def report(done: list[dict], aa: list[dict], levels: list[tuple[str, float]], combo: Combination,
           settings: PerfSettings, plan: duet.Plan, args) -> None:
    ab = ABSettings(tolerance=args.tolerance, restart_every=args.restart_every)
    half = f"{100 * args.tolerance / 2:.3g}%"  # 2.5%, not 2%
    pairs = worker_pairs(aa, ab.restart_every)
    print(f"\nA/B gate power, {combo.id}, {plan.mode}, {args.condition}, {args.cpu or 'this CPU'}, "
          f"tolerance {100 * args.tolerance:.3g}% "
          f"(regression: significant and beyond -{half}; pass: -{half} ruled out), "
          f"rounds {settings.rounds} (+{settings.batch}) up to {settings.max_rounds}; resampled from "
          f"{sum(g['rounds'] for g in aa)} A/A rounds of {len(aa)} gates ({pairs} worker pairs)")
    if aa and pairs < MIN_PAIRS:
        print(f"(only {pairs} worker pairs to resample from: each is a large share of every draw, so the resampled "
              f"false-alarm and UNDECIDED rates are rough until at least {MIN_PAIRS} back them: keep more A/A gates)")
    print(f"{'slowdown':>12} | {'real gates':>10} {'regression':>10} {'undecided':>9} {'rounds':>6} {'min/gate':>8} | "
          f"{'resampled':>9} {'regression':>10} {'undecided':>9} {'rounds':>6}")
    rng = random.Random(20261123)
    for level in levels:
        gates = [g for g in done if level_of(g) == level]
        n = len(gates) or 1
        shift = shifts(done, level)
        sim = simulate(aa, shift, combo, settings, ab, args.trials, rng) if aa and shift else None
        real = (f"{len(gates):>10} {sum(g['outcome'] == 'regression' for g in gates) / n:>10.0%} "
                f"{sum(g['outcome'] == 'undecided' for g in gates) / n:>9.0%} "
                f"{sum(g['rounds'] for g in gates) / n:>6.1f} {sum(g['minutes'] for g in gates) / n:>8.1f}")
        simulated = (f"{args.trials:>9} {sim['regression']:>10.1%} {sim['undecided']:>9.1%} {sim['rounds']:>6.1f}" if sim
                     else f"{'(needs A/A gates, and real gates for a draft level)':>38}")
        print(f"{label(level):>12} | {real} | {simulated}")
    rounds = [r for g in aa for r in zip(*(g["ratios"][m] for m in METRICS))]
    spread = {m: math.sqrt(sum(math.log(r[i]) ** 2 for r in rounds) / max(1, len(rounds) - 1))
              for i, m in enumerate(METRICS)} if rounds else {}
    print("A/A per-round spread of ln(candidate/base): " + ", ".join(f"{m} {v:.1%}" for m, v in spread.items()))
    if split := time_split(done):
        print(f"A real gate's time: {split[0]:.1f} s a round measuring, {split[1]:.0f} s a worker start or restart "
              "(both arms loading and warming up)")


def stored_gate_fails(stored: dict[str, list[float]], measured: dict[str, list[float]],
                      settings: PerfSettings) -> tuple[bool, float]:
    """The stored-baseline gate's rule (harness/perf/stored/stats.py) on these rounds: the tolerance it would
    calibrate from the stored rounds (as `pytest -m perf --update-baselines` does), then each metric's
    comparison at the cap. Returns (failed, the widest tolerance it used)."""
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, settings.looks())
    failed, widest = False, 0.0
    for m in METRICS:
        drift, _ = stats.drift_sd(stored[m], settings.drift_block)
        tol = stats.calibrated_tolerance(stored[m], cap=settings.max_rounds, alpha=alpha, drift=drift,
                                         floor=settings.tolerance_floor)
        d = stats.compare_samples(m, stored[m], measured[m], tol, alpha=alpha, at_cap=True, drift_sd=drift)
        failed |= d.verdict == Outcome.REGRESSION
        widest = max(widest, tol)
    return failed, widest


def benchmark_compare_fails(stored: dict[str, list[float]], measured: dict[str, list[float]],
                            tolerance: float) -> bool:
    """pytest-benchmark's own --benchmark-compare-fail=mean:T% check (its PercentageRegressionCheck)
    on the mean time per token of plain and of assisted decoding."""
    check = parse_compare_fail(f"mean:{round(tolerance * 100)}%")
    mean = lambda tps: statistics.fmean(1 / v for v in tps)  # noqa: E731 - seconds per token
    return any(check.fails({"mean": mean(measured[m])}, {"mean": mean(stored[m])})
               for m in ("plain_tokens_per_sec", "assisted_tokens_per_sec"))


def compare_gates(done: list[dict], levels: list[float], settings: PerfSettings, tolerance: float) -> None:
    """The three gates on the same trials: each gate's candidate rounds against a baseline stored at
    another time (the base arm of the earliest other gate), and the A/B verdict of the gate itself."""
    gates = [g for g in done if "arms" in g]
    if len(gates) < 2:
        print("(the stored-baseline and pytest-benchmark comparison needs 2 gates that recorded both arms)")
        return
    print(f"\nSame trials, three gates (tolerance {tolerance:.0%}): share of gates that call a regression")
    print(f"{'slowdown':>12} | {'gates':>5} {'A/B gate':>8} {'stored-baseline gate':>20} {'(its tolerance)':>15} "
          f"{'pytest-benchmark mean:' + str(round(tolerance * 100)) + '%':>25}")
    for level in levels:
        rows = [g for g in gates if level_of(g) == level]
        if not rows:
            continue
        stored_fail, benchmark_fail, widest = 0, 0, []
        for g in rows:
            stored = next(o for o in gates if o is not g)["arms"]["base"]
            failed, tol = stored_gate_fails(stored, g["arms"]["candidate"], settings)
            stored_fail += failed
            widest.append(tol)
            benchmark_fail += benchmark_compare_fails(stored, g["arms"]["candidate"], tolerance)
        n = len(rows)
        ab = sum(g["outcome"] == "regression" for g in rows)
        print(f"{label(level):>12} | {n:>5} {ab / n:>8.0%} {stored_fail / n:>20.0%} {statistics.median(widest):>15.0%} "
              f"{benchmark_fail / n:>25.0%}")


if __name__ == "__main__":
    with termination.sigterm_as_interrupt():  # a kill between or inside gates closes the workers as Ctrl-C does
        try:
            sys.exit(main())
        except KeyboardInterrupt as stop:  # the workers are closed by now; every finished gate is in --out
            print(f"ab_power: stopped ({stop or 'Ctrl-C'}); the gate under way is dropped, the finished ones are "
                  "kept: the same command resumes", file=sys.stderr)
            sys.exit(termination.EXIT_STATUS if isinstance(stop, termination.Terminated) else 130)
