"""The A/B gate's power in one table, made from every kept gate (benchmarks/data/ab_power_*.jsonl).

A row is one CPU class, CPU (its model name and generation, where the gates recorded it; one class
covers several), combination, host condition, tolerance and planted level of one data file:
its real gates' outcomes, the rounds at which they decided, their minutes, and whether the targets of
issues 25 and 27 are met (on the combination each class's merge gate runs today; rows of older
combinations are kept as what was measured, with no target). A/A rows add the rates of gates resampled
from the file's A/A rounds (benchmarks/ab_power.py's resampling), kept in
benchmarks/data/ab_power_resampled.json because they take minutes; a row whose rounds or the gate's
stopping rule changed since says so until --resample runs. docs/gate-power.md holds the table between
its markers; a unit test checks that it is the one these files make, so a figure there has one home:
the data.

    python benchmarks/gate_power_table.py                       # print the table
    python benchmarks/gate_power_table.py --resample --write    # resample what changed, write the doc
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import ab_power
from harness.core.jsonio import atomic_write_text
from harness.machine import capability
from harness.perf import combinations, replay
from harness.perf.ab import duet
from harness.perf.ab.gate import STOPPING_RULE, ABSettings
from harness.perf.combinations import PerfSettings
from harness.perf.plant import ASSISTED_ONLY, PHASE_OF, PLANT_INTO
from harness.perf.record import GATED_PHASES, METRICS
from harness.workload import registry

log = logging.getLogger("gate_power_table")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"
DOC = REPO / "docs" / "gate-power.md"
RESAMPLED = DATA / "ab_power_resampled.json"
BEGIN = "<!-- gate-power-table: made by python benchmarks/gate_power_table.py --write from benchmarks/data; edit the data, not this table -->"
END = "<!-- /gate-power-table -->"
TRIALS = 2000
SEED = 20261123
CONDITIONS = ("quiet", "noisy")  # host conditions the targets speak of; other labels are kept as measured
NOISY = "python benchmarks/noisy_host.py --duty 0.3 --burst-ms 200 -- "  # make noisy-host's neighbour
# The targets (issues 25 and 27): gates a level, gates that must catch (or, A/A, none may), minutes a gate.
GATES, CAUGHT, ENV_GATES, ENV_CAUGHT = 20, 19, 10, 9
MINUTES, MINUTES_AT_5 = 5.0, 10.0
# Issue 27's glue: 5 ms added to each assisted step. A glue level is a fraction of the verification
# pass (harness/perf/plant.py), so the ms it plants follow the host's speed: a level whose own gates
# planted at least ab_power.SIZED of that is the target's; a smaller one holds it only by meeting it (a
# smaller slowdown caught shows the larger one would be), and is kept without a target once it misses.
# Its command asks for glue:5ms, which ab_power.py sizes on the CPU that runs it (ab_power.sized_level).
GLUE_MS = 5.0
MAX_RESAMPLED_FALSE_ALARMS = 0.01
# A file named after another with this suffix holds levels of it measured again after the gate changed.
MEASURED_AGAIN = "_phase-located"

Level = ab_power.Level
AA: Level = ("target", 0.0)  # unchanged code against itself


@dataclass(frozen=True)
class Group:
    """The gates one ab_power.py command adds to on one CPU: same file, class, host condition, arms' mode
    (and, side by side, the period of their exchange of cores within a round), combination, tolerance and looks."""
    file: str
    cpu_class: str
    condition: str
    mode: str
    combination: str
    tolerance: float
    looks: tuple[int, int, int]  # first look, rounds between looks, cap
    swap_s: float | None = None  # side by side: the arms' exchange of cores within a round (None: between rounds)
    stand_in: bool = False  # side by side with the stand-in on the core of the arm that finished first
    synced: bool = False  # side by side, both arms asked to start each run of a round together (--duet-sync)
    cpu: str | None = None  # the CPU's model name and generation (ab_power.host_of); None: not recorded

    @property
    def place(self) -> Group:
        """Where the gates go, whichever CPU runs them: ab_power.py counts each CPU's own apart."""
        return dataclasses.replace(self, cpu=None)

    @property
    def pair(self) -> str:
        return self.combination.split(":", 1)[0]

    @property
    def key(self) -> str:
        """The resampled rates' key: the A/A pool (any tolerance, any looks), the tolerance and the looks."""
        looks = "+".join(map(str, self.looks))
        swap = f"|swap {self.swap_s:g}" if self.swap_s else ""
        swap += "|stand-in" if self.stand_in else ""
        swap += "|sync" if self.synced else ""
        cpu = f"|{self.cpu}" if self.cpu else ""
        return (f"{self.file}|{self.cpu_class}{cpu}|{self.condition}|{self.mode}{swap}|{self.combination}|"
                f"{self.tolerance:g}|{looks}")


def load_rows(files: Iterable[Path]) -> list[tuple[str, dict]]:
    """Every kept gate, with the name of its file; a line that is not JSON names the file and line."""
    rows = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rows.append((path.name, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: not a gate row ({exc.msg}); restore the file from git") from None
    return rows


def group_of(file: str, row: dict, default_looks: tuple[int, int, int]) -> Group:
    looks = row.get("looks") or {}
    return Group(file, row.get("cpu_class", "?"), row.get("condition", "quiet"), row.get("mode", "interleaved"),
                 row["combination"], row.get("tolerance") or ABSettings().tolerance,
                 (looks.get("rounds", default_looks[0]), looks.get("batch", default_looks[1]),
                  looks.get("max_rounds", default_looks[2])), row.get("swap_s"), ab_power.has_stand_in(row),
                 ab_power.synced(row), ab_power.host_of(row))


def grouped(rows: list[tuple[str, dict]], default_looks: tuple[int, int, int]) -> dict[Group, dict[Level, list[dict]]]:
    out: dict[Group, dict[Level, list[dict]]] = {}
    for file, row in rows:
        out.setdefault(group_of(file, row, default_looks), {}).setdefault(ab_power.level_of(row), []).append(row)
    return out


def aa_pool(rows: list[tuple[str, dict]], group: Group, default_looks: tuple[int, int, int]) -> list[dict]:
    """The A/A gates whose rounds the group's resampled gates draw from, as ab_power.py pools them:
    same file, class, CPU, condition, mode and combination, at any tolerance and looks."""
    return [row for file, row in rows if ab_power.level_of(row) == AA
            and dataclasses.replace(group_of(file, row, default_looks), tolerance=group.tolerance,
                                    looks=group.looks) == group]


def todays_combinations(pairs: Iterable[str]) -> dict[tuple[str, str], str]:
    """(CPU class, pair) -> the combination id the class's merge gate runs today (harness/matrix.toml)."""
    out = {}
    for cpu_class in capability.CLASSES:
        matrix = registry.load_matrix(cpu_class=cpu_class)
        settings = PerfSettings.from_matrix(matrix)
        for pair in pairs:
            out[cpu_class, pair] = combinations.of_pair(matrix, pair, settings, given_by="benchmarks/gate_power_table.py").id
    return out


def level_name(level: Level) -> str:
    into, fraction = level
    if into == ab_power.ENV:
        return "two environments, unchanged" if not fraction else f"env: decoder layers {100 * fraction:.3g}% slower"
    if not fraction:
        return "A/A"
    return ab_power.label(level) + (" (plain untouched)" if into == "draft" else "")


def level_arg(level: Level) -> str:
    """The level as ab_power.py's --levels takes it."""
    into, fraction = level
    return f"{fraction:g}" if into == "target" else f"{into}:{fraction:g}"


def level_order(level: Level) -> tuple:
    into, fraction = level
    places = (*PLANT_INTO, ab_power.ENV)
    return (fraction > 0, places.index(into) if into in places else len(places), -fraction)  # unchanged first


def caught(row: dict, level: Level) -> bool:
    """A planted level's gate called a regression, naming one of the planted phases where the slowdown
    is in part of an assisted step (issue 27: the message points at the code)."""
    if row["outcome"] != "regression":
        return False
    kept = [p for p in names_phase(level) if p in row.get("verdicts", {})]
    return not kept or any(row["verdicts"][p] == "regression" for p in kept)


def names_phase(level: Level) -> tuple[str, ...]:
    """The phases a gate of this level should name one of: those slowed where a plant slows part of an
    assisted step (rows from before per-phase costs record no phase verdicts and are judged without;
    rows from before a phase was gated are judged on those they have)."""
    into, fraction = level
    return PHASE_OF[into] if fraction and into in ASSISTED_ONLY else ()


def outcomes(gates: list[dict], level: Level, today: list[Replayed] | None = None) -> str:
    """The gates' recorded outcomes; then, where today's gate code replayed on their rounds would
    have stopped elsewhere (`today`, one per gate), how many and where."""
    counts = {o: sum(g["outcome"] == o for g in gates) for o in ("regression", "pass", "undecided")}
    text = ", ".join(f"{n} {o.upper()}" for o, n in counts.items() if n)
    named = names_phase(level)
    recorded = [g for g in gates if g["outcome"] == "regression" and any(p in g.get("verdicts", {}) for p in named)]
    if recorded:
        text += f" ({sum(caught(g, level) for g in recorded)} naming {' or '.join(f'`{p}`' for p in named)})"
    today = today or []
    later = sum(r.cut_short for r in today)
    if later:
        text += f"; {later} stopped by an earlier rule where today's gate looks again (the calls stand)"
    sooner = [(r.rounds, r.outcome) for g, r in zip(gates, today) if not r.cut_short and r.rounds < g["rounds"]]
    if sooner:
        where = ", ".join(f"{o.upper()} at {n} x{sooner.count((n, o))}" for n, o in sorted(set(sooner)))
        text += f"; {len(sooner)} today's gate ends sooner on the same rounds ({where})"
    return text


def replay_setup(group: Group) -> tuple[combinations.Combination, PerfSettings, ABSettings]:
    """The combination, settings (the group's looks) and tolerance the group's gates are replayed at."""
    matrix = registry.load_matrix(cpu_class=group.cpu_class if group.cpu_class in capability.CLASSES else None)
    first, batch, cap = group.looks
    settings = dataclasses.replace(PerfSettings.from_matrix(matrix), rounds=first, batch=batch, max_rounds=cap)
    combo = combinations.of_pair(matrix, group.pair, settings, given_by="benchmarks/gate_power_table.py")
    return combo, settings, ABSettings(tolerance=group.tolerance)


@dataclass(frozen=True)
class Replayed:
    """Today's gate code replayed on one kept gate's rounds (harness/perf/replay.py)."""
    rounds: int      # where it stopped
    outcome: str     # its outcome there
    verdicts: dict[str, str]  # each metric's verdict there
    cut_short: bool  # it would have looked again after the recording's end: an earlier rule stopped the gate
    # (its regression call stands under today's rule, harness/perf/ab/gate.py `standing`; a phase it did
    # not name might have been named at a later look)


def replayed(row: dict, setup: tuple[combinations.Combination, PerfSettings, ABSettings]) -> Replayed:
    arms = [replay.RecordedArm(arm, f"recorded {arm}", replay.power_row_rounds(row, arm)) for arm in ("base", "candidate")]
    result = replay.ab_gate(*setup, *arms).run()
    return Replayed(result.rounds, result.outcome.value, {m: d.verdict.value for m, d in result.decisions.items()},
                    result.cut_short)


def as_today(row: dict, today: Replayed | None) -> dict:
    """The gate as today's gate code decides it on the same rounds, where that stops sooner; its
    minutes stay as recorded (more than today's gate would take)."""
    if today is None or today.cut_short or today.rounds >= row["rounds"]:
        return row
    return {**row, "outcome": today.outcome, "rounds": today.rounds, "verdicts": today.verdicts}


def decided_at(gates: list[dict]) -> str:
    """'8 x18, 16 x2': how many gates decided at each look."""
    by = sorted({g["rounds"] for g in gates})
    return ", ".join(f"{r} x{sum(g['rounds'] == r for g in gates)}" for r in by)


def minutes(gates: list[dict]) -> str:
    m = [g["minutes"] for g in gates]
    return f"{m[0]:.1f}" if len(m) == 1 else f"{statistics.fmean(m):.1f} ({min(m):.1f}-{max(m):.1f})"


def target(group: Group, level: Level, gates: list[dict], resampled: dict | None = None) -> str:
    """Where the row stands against the issues' targets: 'met', 'N of 20 so far' or what missed. An
    A/A row needs its resampled gates too (`resampled`: their rates, None where not made from these
    rounds): at most 1% of them a false alarm, once at least ab_power.MIN_PAIRS worker pairs back them
    (from fewer, each pair is a large share of every draw and the rate says little)."""
    into, fraction = level
    env = into == ab_power.ENV
    need, must = (ENV_GATES, ENV_CAUGHT) if env else (GATES, CAUGHT)
    n = len(gates)
    rates = resampled if resampled and resampled["pairs"] >= ab_power.MIN_PAIRS else None
    if not fraction:  # unchanged: no gate may call a regression
        bad = sum(g["outcome"] == "regression" for g in gates)
        missed = [f"{bad} false alarm{'s' * (bad != 1)}"] if bad else []
        if not env and rates and rates["regression"] > MAX_RESAMPLED_FALSE_ALARMS:
            missed.append(f"{rates['regression']:.1%} of resampled gates a false alarm")
    else:
        hits = sum(caught(g, level) for g in gates)
        missed = [f"{hits} of {n} caught"] if n - hits > need - must else []
    limit = None if env else (MINUTES if group.tolerance > 0.05 else (MINUTES_AT_5 if fraction else None))
    mean = statistics.fmean(g["minutes"] for g in gates)
    if limit is not None and n >= need and mean > limit:
        missed.append(f"{mean:.1f} min a gate (target {limit:g})")
    if missed:
        return "missed: " + "; ".join(missed)
    if n >= need and not fraction and not env and rates is None:
        return f"{n} gates; resampled rates from {ab_power.MIN_PAIRS} worker pairs to come"
    return "met" if n >= need else f"{n} of {need} so far"


def meets(status: str) -> bool:
    """A target column's status says the row meets its target ('met', 'met at 3.5 ms a step')."""
    return status == "met" or status.startswith("met at ")


def missed(status: str) -> bool:
    return status.startswith("missed")


def fresh(group: Group, pool: list[dict], resampled: dict) -> dict | None:
    """The group's kept resampled rates, if they were made from these A/A rounds under today's stopping rule."""
    entry = resampled.get(group.key)
    return (entry if entry and entry["aa_rounds"] == sum(g["rounds"] for g in pool)
            and entry.get("rule") == STOPPING_RULE else None)


def resampled_cell(group: Group, pool: list[dict], resampled: dict) -> str:
    entry, rounds = fresh(group, pool, resampled), sum(g["rounds"] for g in pool)
    if not entry:
        return "not resampled since its rounds or the gate's stopping rule changed (--resample)"
    rough = " rough:" if entry["pairs"] < ab_power.MIN_PAIRS else ""
    return (f"{entry['regression']:.1%}, {entry['undecided']:.1%}, {entry['rounds']:.1f} "
            f"({entry['trials']} gates;{rough} {rounds} A/A rounds, {entry['pairs']} worker pairs)")


def resample(group: Group, pool: list[dict], trials: int) -> dict:
    """A/A gates replayed through the gate's own code on the pool's rounds, drawn by worker pair
    (ab_power.simulate), at the group's tolerance and looks."""
    combo, settings, ab = replay_setup(group)
    unchanged = {m: 1.0 for m in (*METRICS, *GATED_PHASES)}
    rates = ab_power.simulate(pool, unchanged, combo, settings, ab, trials, random.Random(SEED))
    return {"aa_rounds": sum(g["rounds"] for g in pool), "rule": STOPPING_RULE,
            "pairs": ab_power.worker_pairs(pool, ab.restart_every), "trials": trials, **{k: round(v, 6) for k, v in rates.items()}}


def measured_again(group: Group, level: Level, groups: dict[Group, dict[Level, list[dict]]]) -> Group | None:
    """The group that holds this level measured again, if one does: same setup, in the file named
    after this one's with MEASURED_AGAIN (`X_phase-located.jsonl` after `X.jsonl`; other suffixes,
    such as `_phases` or `_env`, name sister files, not re-measurements). That row is the one judged
    and resumed; this one's gates stay in the table as measured."""
    other = dataclasses.replace(group, file=group.file.removesuffix(".jsonl") + MEASURED_AGAIN + ".jsonl")
    return other if level in groups.get(other, {}) else None


@dataclass(frozen=True)
class Target:
    """A column of the at-a-glance table: one level the issues set a target for, at its tolerance."""
    title: str
    tolerance: float
    into: str
    fraction: float | None  # None: sized on each CPU to plant `ms` a step (glue; ab_power.sized_level)
    ms: float | None = None

    def holds(self, level: Level, verify: float | None) -> bool:
        """The level is this target's: its place and fraction or, sized per CPU, a fraction of the
        verification pass (`verify`: its ms in the level's own gates) that plants at least
        ab_power.SIZED of `ms`."""
        into, fraction = level
        if into != self.into:
            return False
        if self.fraction is not None:
            return fraction == self.fraction
        return ab_power.plants(level, verify, self.ms)

    def under(self, level: Level, verify: float | None) -> bool:
        """The level is of this target's place but, sized per CPU, plants less than ab_power.SIZED of `ms`:
        it holds the target only by meeting it."""
        return (self.fraction is None and level[0] == self.into and bool(level[1])
                and ab_power.glue_ms(level, verify) is not None and not self.holds(level, verify))

    @property
    def asked(self) -> str:
        """The level as ab_power.py's --levels asks for it: its fraction, or its ms a step (glue:5ms), which
        ab_power.py sizes on the CPU that runs it."""
        return level_arg((self.into, self.fraction)) if self.fraction is not None else str(ab_power.PerStep(self.into, self.ms))


# Each holds quiet and under the noisy neighbour (CONDITIONS): issue 25 says so, and issue 27 names no
# condition, so its phase and environment targets hold wherever the gate runs.
TARGETS = (Target("A/A", 0.10, "target", 0.0), Target("target 10%", 0.10, "target", 0.10),
           Target("draft 20%", 0.10, "draft", 0.20), Target("draft 10%", 0.10, "draft", 0.10),
           Target("verify 10%", 0.10, "verify", 0.10),
           Target(f"glue ({GLUE_MS:g} ms a step)", 0.10, "glue", None, GLUE_MS),
           Target("A/A at 5%", 0.05, "target", 0.0), Target("target 5% at 5%", 0.05, "target", 0.05),
           Target("two environments", 0.10, ab_power.ENV, 0.0), Target("env 10%", 0.10, ab_power.ENV, 0.10))

# The setup the gate runs side by side by default today: the default exchange of cores, with the stand-in.
TODAY = {"mode": "duet", "swap_s": duet.SWAP_S, "stand_in": True, "synced": False}


def todays_setup(group: Group) -> bool:
    """The group ran side by side as the gate does by default today."""
    return all(getattr(group, field) == value for field, value in TODAY.items())


def todays(group: Group, *, env: bool | None = None) -> Group:
    """The group in today's setup, in the file it goes to (todays_file)."""
    return dataclasses.replace(group, file=todays_file(group, env=env), **TODAY)


def resumed(group: Group) -> Group:
    """The group new gates of this one's levels go to: itself where ab_power.py still adds to it, else
    today's setup's (a file side by side without the stand-in is kept as measured)."""
    return group if ab_power.takes_gates(group.mode, group.stand_in) else todays(group)


def todays_file(group: Group, *, env: bool | None = None) -> str:
    """The file today's setup of the group's class, condition and combination goes to:
    ab_power_amx_duet-swap0.05_quiet_k16-fused-c0.6.jsonl ->
    ab_power_amx_duet-swap0.05-standin_quiet_k16-fused-c0.6.jsonl (none for a level measured again:
    today's file holds each level once). Levels across environments go to an `_env` sister file:
    `env` True or False names it or the other, None keeps the group's."""
    rest = group.file.removesuffix(".jsonl").removesuffix(MEASURED_AGAIN).partition(f"_{group.condition}")[2]
    if env is not None:
        rest = ("_env" if env else "") + rest.removeprefix("_env")
    return f"ab_power_{group.cpu_class}_duet-swap{TODAY['swap_s']:g}-standin_{group.condition}{rest}.jsonl"


def closeness(group: Group) -> tuple:
    """How close a group's setup is to today's, for max(): side by side, then with the stand-in, then at
    today's exchange, then exchanging within rounds at all, then starting runs together as today does (or not)."""
    return (group.mode == TODAY["mode"], group.stand_in == TODAY["stand_in"], group.swap_s == TODAY["swap_s"],
            bool(group.swap_s), group.synced == TODAY["synced"])


def setup_name(group: Group) -> str:
    if group.mode != "duet":
        return "in turn"
    swap = f"exchange every {group.swap_s:g} s" if group.swap_s else "exchange between rounds"
    return swap + (", stand-in" if group.stand_in else ", no stand-in") + (", runs started together" if group.synced else "")


def glance(cells: Cells, classes: list[str]) -> list[str]:
    """Where each class's merge gate stands against each target on each CPU: today's setup's status, else
    that of the earlier setup closest to it, marked with a letter the legend under the table names, else
    '-'. `cells`: (class, CPU, condition, target) -> the judged rows (group, level, target status) that
    hold it; where several of today's do (two glue sizes), each is named by its level, unless one meets
    the target and none missed it. A class's CPUs: those recorded by name, then the rows kept before the
    CPU was recorded (one CPU's rows never stand for another's)."""
    letters: dict[str, str] = {}  # an earlier setup's name -> its mark, in order of first use
    lines = ["| class | CPU | condition | " + " | ".join(t.title for t in TARGETS) + " |",
             "|---|---|---|" + "---|" * len(TARGETS)]
    for cpu_class in classes:
        cpus = {key[1] for key in cells if key[0] == cpu_class}
        for cpu in sorted(cpus - {None}) + [None] * (None in cpus):
            for condition in CONDITIONS:
                lines.append(f"| {cpu_class} | {cpu or ab_power.NOT_RECORDED} | {condition} | "
                             + " | ".join(glance_cell(cells.get((cpu_class, cpu, condition, t), []), letters)
                                          for t in TARGETS) + " |")
    if letters:
        lines += ["", "Earlier setups: " + "; ".join(f"({mark}) {name}" for name, mark in letters.items()) + "."]
    return lines


def glance_cell(held: list[tuple[Group, Level, str]], letters: dict[str, str]) -> str:
    """One target on one CPU and condition: see glance."""
    today = [(level, status) for g, level, status in held if todays_setup(g)]
    if not any(missed(status) for _, status in today):  # a level that meets it stands for it alone
        today = [entry for entry in today if meets(entry[1])][:1] or today
    if len(today) == 1:
        return today[0][1]
    if today:
        return "; ".join(f"{ab_power.label(level)}: {status}" for level, status in today)
    if held:
        g, _, status = max(held, key=lambda entry: closeness(entry[0]))
        mark = letters.setdefault(setup_name(g), chr(ord("a") + len(letters)))
        return f"({mark}) {status}"
    return "-"


def command(group: Group, targets: list[Target], default_looks: tuple[int, int, int]) -> str:
    arms = f"on --duet-swap {group.swap_s or 0:g}" if group.mode == "duet" else "off"
    arms += " --duet-sync" if group.synced else ""
    flags = [f"--pair {group.pair}", f"--duet {arms}", f"--levels {','.join(t.asked for t in targets)}"]
    if group.tolerance != ABSettings().tolerance:
        flags.append(f"--tolerance {group.tolerance:g}")
    if group.looks[1] != default_looks[1]:
        flags.append(f"--batch {group.looks[1]}")
    if group.looks[2] != default_looks[2]:
        flags.append(f"--max-rounds {group.looks[2]}")
    flags += [f"--gates {ENV_GATES if any(t.into == ab_power.ENV for t in targets) else GATES}",
              f"--out benchmarks/data/{group.file}"]
    return (NOISY if group.condition == "noisy" else "") + "python benchmarks/ab_power.py " + " ".join(flags)


# (class, CPU, condition, target) -> rows
Cells = dict[tuple[str, str | None, str, Target], list[tuple[Group, Level, str]]]
# where gates go (Group.place) -> the targets whose levels its command asks for
Wanted = dict[Group, set[Target]]


@dataclass(frozen=True)
class Kept:
    """The kept gates by group, with what judging them needs: the groups of the combination their class
    gates today and the default looks."""
    rows: list[tuple[str, dict]]
    groups: dict[Group, dict[Level, list[dict]]]
    current: frozenset[Group]
    default_looks: tuple[int, int, int]

    @classmethod
    def of(cls, rows: list[tuple[str, dict]], default_looks: tuple[int, int, int]) -> Kept:
        groups = grouped(rows, default_looks)
        today = todays_combinations({g.pair for g in groups})
        current = frozenset(g for g in groups if today.get((g.cpu_class, g.pair)) == g.combination)
        return cls(rows, groups, current, default_looks)

    def judged(self, g: Group) -> bool:
        return g in self.current and g.condition in CONDITIONS and g.looks == self.default_looks

    def order(self, g: Group) -> tuple:
        classes = capability.CLASSES
        return (classes.index(g.cpu_class) if g.cpu_class in classes else len(classes), g not in self.current,
                g.combination, CONDITIONS.index(g.condition) if g.condition in CONDITIONS else len(CONDITIONS),
                g.condition, -g.tolerance, g.looks != self.default_looks, g.file, g.cpu is None, g.cpu or "")

    def listed(self, g: Group) -> tuple:
        """The commands' order: by class, condition, across environments last, 10% first."""
        order = self.order(g)
        return order[0], order[3], "_env" in g.file, -g.tolerance


def table_lines(kept: Kept, resampled: dict) -> tuple[list[str], Cells, Wanted]:
    """The table's rows, a level of a group each; the judged rows that hold each target; and where
    each one's gates go."""
    cells: Cells = {}
    wanted: Wanted = {}
    lines = ["| class | CPU | combination | condition | tolerance | level | gates | outcomes | decided at round (gates) "
             "| minutes a gate: mean (range) | target | resampled A/A: regression, UNDECIDED, rounds | data |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for group in sorted(kept.groups, key=kept.order):
        judged = kept.judged(group)
        combo = group.combination.split(":", 1)[1].replace(":cpu:", ":") + (" (today's)" if group in kept.current else "")
        looks = ("" if group.looks == kept.default_looks
                 else f", looks {group.looks[0]}+{group.looks[1]} to {group.looks[2]}")
        setup = replay_setup(group) if judged else None
        set_here = [t for t in TARGETS if t.tolerance == group.tolerance]
        for level in sorted(kept.groups[group], key=level_order):
            gates = kept.groups[group][level]
            today = [replayed(g, setup) for g in gates] if setup else None
            pool = aa_pool(kept.rows, group, kept.default_looks) if level == AA else []
            cell = resampled_cell(group, pool, resampled) if pool else ""
            again = measured_again(group, level, kept.groups)
            verify = ab_power.verify_ms(gates)  # a glue level plants its fraction of its own gates' pass
            ms = ab_power.glue_ms(level, verify)
            under = [t for t in set_here if t.under(level, verify)] if judged and not again else []
            held = [t for t in set_here if t.holds(level, verify)] + under if judged and not again else []
            status = ("-" if not judged else f"measured again: {short(again.file)}" if again
                      else target(group, level, [as_today(g, t) for g, t in zip(gates, today or [None] * len(gates))],
                                  fresh(group, pool, resampled)) if held else "-")
            if under and missed(status):  # a smaller slowdown missed says nothing of the target's
                held, status = [], f"no target: under {GLUE_MS:g} ms a step; {status}"
            elif under and meets(status):
                status += f" at {ms:.1f} ms a step"
            for t in held:
                cells.setdefault((group.cpu_class, group.cpu, group.condition, t), []).append((group, level, status))
                wanted.setdefault(resumed(group).place, set()).add(t)
            name = level_name(level) + (f" ({ms:.1f} ms a step)" if ms is not None else "")
            lines.append(f"| {group.cpu_class} | {group.cpu or ab_power.NOT_RECORDED} | `{combo}` | {group.condition}{looks} "
                         f"| {100 * group.tolerance:g}% "
                         f"| {name} | {len(gates)} | {outcomes(gates, level, today)} | {decided_at(gates)} "
                         f"| {minutes(gates)} | {status} | {cell} | {short(group.file)} |")
    return lines, cells, wanted


def want_missing(kept: Kept, cells: Cells, wanted: Wanted) -> None:
    """The targets no judged row of a class, CPU and condition holds yet go to today's setup's file, named
    after the setup closest to it of that class, CPU and condition."""
    nearest: dict[tuple[str, str | None, str], Group] = {}  # (class, CPU, condition) -> its judged group closest to today's
    for g in sorted(kept.groups, key=kept.order):  # ties: the first in the table
        here = (g.cpu_class, g.cpu, g.condition)
        if kept.judged(g) and (here not in nearest or closeness(g) > closeness(nearest[here])):
            nearest[here] = g
    for (cpu_class, cpu, condition), near in nearest.items():
        for t in TARGETS:
            if not cells.get((cpu_class, cpu, condition, t)):
                to = dataclasses.replace(todays(near, env=t.into == ab_power.ENV), tolerance=t.tolerance).place
                wanted.setdefault(to, set()).add(t)


def render(rows: list[tuple[str, dict]], resampled: dict, default_looks: tuple[int, int, int]) -> str:
    """The markdown between the doc's markers: the glance table, the table, then the commands that add
    the gates the targets still need."""
    kept = Kept.of(rows, default_looks)
    lines, cells, wanted = table_lines(kept, resampled)
    want_missing(kept, cells, wanted)
    intro = ("Where each class's merge gate stands against the targets on each CPU, on the combination it gates "
             "today (a CPU: its model name and family and model numbers, as each gate recorded them since "
             "2026-12-05; 'not recorded' before): side by "
             f"side with the default exchange ({TODAY['swap_s']:g} s) and the stand-in; where that has no gates for a "
             "target yet, the earlier setup closest to it that has, marked with a letter; '-' where none has. Each cell "
             "is the target column of the row (or, naming their levels, rows) of the table under it that hold the "
             "target; each row names its data file. A glue level is a fraction of the verification pass, so it holds "
             f"the {GLUE_MS:g} ms target where its gates planted at least {ab_power.SIZED:.0%} of it, and a level that planted "
             "less holds it only by meeting it ('met at' its ms: a smaller slowdown caught shows the larger one would be).")
    how = ("The commands that bring each target to its gates: the targets of the rows that hold one, in their own "
           "file where `ab_power.py` still adds to it, else in today's setup's, and the targets without gates, in "
           "today's setup's; a level that has its gates on the CPU that runs the command runs none there (`ab_power.py` "
           f"counts each CPU's gates apart, and sizes glue:{GLUE_MS:g}ms on it: the level whose gates there planted "
           f"{GLUE_MS:g} ms a step, else a new one sized by its latest verification passes; `--gates 0 --trials 2000` "
           "prints the rates again):")
    return "\n".join([intro, "", *glance(cells, list(capability.CLASSES)), "", *lines, "", how, "",
                      *(f"    {command(g, [t for t in TARGETS if t in wanted[g]], default_looks)}"
                        for g in sorted(wanted, key=kept.listed))])


def short(file: str) -> str:
    """ab_power_amx_duet_quiet.jsonl -> amx_duet_quiet (the table's data column)."""
    return file.removeprefix("ab_power_").removesuffix(".jsonl")


def replace_between_markers(text: str, table: str, where: Path) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{where}: the markers {BEGIN!r} and {END!r} are missing or out of order; put them back "
                         "where the gate-power table goes")
    return text[:start + len(BEGIN)] + "\n" + table + "\n" + text[end:]


def default_looks() -> tuple[int, int, int]:
    settings = PerfSettings.from_matrix(registry.load_matrix())
    return settings.rounds, settings.batch, settings.max_rounds


def load_resampled(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: not JSON ({exc.msg}); restore it from git or make it again with --resample") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resample", action="store_true",
                   help=f"resample the A/A rows whose rounds or the gate's stopping rule changed ({TRIALS} gates each, "
                   "minutes) and keep the rates in " + str(RESAMPLED.relative_to(REPO)))
    p.add_argument("--trials", type=int, default=TRIALS, help="resampled gates a row (with --resample)")
    p.add_argument("--write", action="store_true", help=f"write the table into {DOC.relative_to(REPO)} between its markers")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error(f"--trials {args.trials}: at least 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    looks = default_looks()
    rows = load_rows(sorted(DATA.glob("ab_power_*.jsonl")))
    resampled = load_resampled(RESAMPLED)
    if args.resample:
        groups = grouped(rows, looks)
        todo = [g for g, levels in groups.items() if AA in levels]
        for i, group in enumerate(todo, 1):
            pool = aa_pool(rows, group, looks)
            if fresh(group, pool, resampled):
                continue
            log.info("[%d/%d] resampling %s (%d A/A gates)", i, len(todo), group.key, len(pool))
            resampled[group.key] = resample(group, pool, args.trials)
            atomic_write_text(RESAMPLED, json.dumps(resampled, indent=1, sort_keys=True) + "\n")  # each row kept as done
        stale = sorted(set(resampled) - {g.key for g in todo})  # rows no kept file makes any more
        if stale:
            log.info("dropping %d resampled rows no kept gates make: %s", len(stale), "; ".join(stale))
            resampled = {k: v for k, v in resampled.items() if k not in stale}
            atomic_write_text(RESAMPLED, json.dumps(resampled, indent=1, sort_keys=True) + "\n")
    table = render(rows, resampled, looks)
    if args.write:
        atomic_write_text(DOC, replace_between_markers(DOC.read_text(encoding="utf-8"), table, DOC))
        log.info("wrote the table into %s", DOC.relative_to(REPO))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
