"""Which phase keeps the A/B gate looking: unchanged gates' rounds against catching glue.

A phase whose estimate is already slower than the regression threshold keeps the gate looking, so
that a real phase slowdown is named rather than passed (`suspect` in harness/perf/ab/gate.py). A
phase that spreads widely a round (`overhead` under a noisy host) is such a suspect by chance too,
and holds unchanged gates open. This replays both kinds of gate under the gate's own code, with
the suspect asked for `--z` standard errors of evidence (ABSettings.suspect_z; 0 is the default):

- unchanged: gates resampled from the kept A/A rounds by worker pair, as benchmarks/ab_power.py
  draws them (benchmarks/data/ab_power_*.jsonl, the setups the table judges);
- glue: the same draws with `--glue-ms` of host work added to every assisted step of the
  candidate (the step's `overhead` and assisted tokens/s moved by it, plain untouched).

It prints, per class, host condition and tolerance, each rule's share of glue gates that name
`overhead` (or `overhead_cpu`, where the rounds carry it), their mean rounds and the unchanged
gates' mean rounds and false alarms.

    python benchmarks/suspect_rule.py --trials 300 --z 0,1.5,2.5 \
        --files '*standin*' 'ab_power_avx512-bf16_duet-swap0.05_[qn]*'   # about 10 minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys

import ab_power
import gate_power_table as table
from harness.perf.outcome import Outcome
from harness.perf.plant import PHASE_OF
from harness.perf.record import GATED_PHASES, METRICS

SEED = 20261205
GLUE = PHASE_OF["glue"]  # the wall-clock overhead, then the CPU one


def step_ms(pool: list[dict], overhead: str = "overhead") -> tuple[float, float]:
    """The unchanged arm's median `overhead` (a phase of it) and median assisted step (draft steps,
    verification and wall-clock overhead), in ms per assisted step, over the pool's rounds."""
    rounds = [p for row in pool for p in row["phases"]["base"] if p]
    per = lambda p, names: sum(p[n]["total_ms"] for n in names) / p["overhead"]["calls"]  # noqa: E731
    return (statistics.median(per(p, [overhead]) for p in rounds if overhead in p),
            statistics.median(per(p, ["draft_step", "verify", "overhead"]) for p in rounds))


def glue_shift(pool: list[dict], ms: float) -> dict[str, float]:
    """ab_power.moved's factors for `ms` more host work (a spin) in every assisted step: on the wall
    clock and, where the rounds carry it, in CPU time."""
    overhead, step = step_ms(pool)
    shift = {m: 1.0 for m in (*METRICS, *GATED_PHASES)}
    shift["overhead"] = overhead / (overhead + ms)
    shift["assisted_tokens_per_sec"] = shift["speedup"] = step / (step + ms)
    if any(GLUE[1] in p for row in pool for p in row["phases"]["base"] if p):
        cpu, _ = step_ms(pool, GLUE[1])
        shift[GLUE[1]] = cpu / (cpu + ms)
    return shift


def gates(pool: list[dict], shift: dict[str, float], setup, trials: int) -> dict[str, float]:
    """`trials` gates drawn by worker pair (ab_power.resampled_gates): their share calling a
    regression, naming `overhead`, and their mean rounds."""
    counts = {"regression": 0, "overhead": 0, "rounds": 0}
    for result in ab_power.resampled_gates(pool, shift, *setup, trials, random.Random(SEED)):
        counts["regression"] += result.outcome == Outcome.REGRESSION
        counts["overhead"] += any(result.decisions[p].verdict == Outcome.REGRESSION for p in GLUE if p in result.decisions)
        counts["rounds"] += result.rounds
    return {k: v / trials for k, v in counts.items()}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=600, help="resampled gates per setup, rule and level")
    p.add_argument("--z", default="0,1,1.5,2,2.5", help="the suspect rules: standard errors of evidence, comma-separated")
    p.add_argument("--files", nargs="+", default=["ab_power_*.jsonl"], metavar="GLOB",
                   help="kept gate files in benchmarks/data (the A/A rounds drawn from)")
    p.add_argument("--glue-ms", type=float, default=5.0, help="host work added to each assisted step (issue 27: 5)")
    args = p.parse_args(argv)
    try:
        args.z = [float(z) for z in args.z.split(",")]
    except ValueError:
        p.error(f"--z {args.z!r}: numbers separated by commas, e.g. 0,1.5,2")
    if args.trials < 1 or args.glue_ms <= 0 or any(z < 0 for z in args.z):
        p.error("--trials at least 1, --glue-ms above 0, --z not below 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    files = sorted({f for pattern in args.files for f in table.DATA.glob(pattern)})
    if not files:
        raise SystemExit(f"--files {' '.join(args.files)}: no kept gates in {table.DATA} match")
    kept = table.Kept.of(table.load_rows(files), table.default_looks())
    setups = [g for g in sorted(kept.groups, key=kept.order) if kept.judged(g) and table.AA in kept.groups[g]]
    print(f"{args.glue_ms:g} ms of glue per assisted step; {args.trials} resampled gates a cell: "
          "glue named / its rounds | unchanged false alarms / rounds")
    for n, group in enumerate(setups, 1):
        pool = [r for r in table.aa_pool(kept.rows, group, kept.default_looks) if r.get("phases")]
        if not pool:
            continue
        print(f"[{n}/{len(setups)}] {group.cpu_class} {group.condition} {group.tolerance:.0%} "
              f"({sum(r['rounds'] for r in pool)} A/A rounds):", file=sys.stderr, flush=True)
        combo, settings, ab = table.replay_setup(group)
        cells, planted, unchanged = [], glue_shift(pool, args.glue_ms), {m: 1.0 for m in (*METRICS, *GATED_PHASES)}
        for z in args.z:
            setup = (combo, settings, dataclasses.replace(ab, suspect_z=z))
            glue, aa = gates(pool, planted, setup, args.trials), gates(pool, unchanged, setup, args.trials)
            cells.append(f"z {z:g}: {glue['overhead']:.1%} / {glue['rounds']:.1f} | {aa['regression']:.1%} / {aa['rounds']:.1f}")
        print(f"{group.cpu_class:12} {group.condition:6} {group.tolerance:4.0%} {table.short(group.file)}\n  "
              + "\n  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
