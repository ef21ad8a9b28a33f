"""How well does the perf gate tell a slowdown from noise on this machine?

Plants slowdowns (default 0, 5, 10, 25%) into the target's forward pass, measures a pool of real
gate rounds at every level (levels interleaved round by round, so all see the same machine), then
replays the gate many times on resamples of those rounds:

  * our gate: harness/perf/stored/verdict.py's sequential indifference-zone test (rounds, +batch while inconclusive,
    cap), failing if any of speedup / assisted tokens/s / plain tokens/s fails, at the fixed
    --tolerance and at the tolerance calibrated from the replay's own baseline half; the
    between-run spread is estimated from the unslowed pool in time order (blocks of drift_block);
  * pytest-benchmark's --benchmark-compare-fail=mean:T on the same rounds: fail if the mean round
    time exceeds the saved run's mean by more than T (its rule: one saved run, no statistics).

Prints detection / false-alarm rates with the time each gate needs. Example (SmolLM2, minutes):
    python benchmarks/gate_power.py --pair smollm2-135m+self --precisions bf16+w8af32 --pool 24
The default pair (tens of minutes):
    python benchmarks/gate_power.py --pair qwen-coder-1.5b+0.5b --precisions bf16+w8af32 --pool 16
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from harness.core import descriptive, jsonio
from harness.measure import interleave
from harness.workload import registry
from harness.perf.stored import stats
from harness.perf.outcome import Outcome
from harness.perf import combinations
from harness.perf.combinations import PerfSettings
from harness.workload.registry import CHOSEN
from harness.perf.record import METRICS
from harness.perf.plant import PlantedSlowdown
from harness.perf.runner import Runner, load_pair


def measure_pools(matrix, combo, settings, levels, pool, progress=True):
    loaded = load_pair(combo)
    slow = PlantedSlowdown(loaded.target.model)
    runner = Runner(combo, loaded, settings)
    runner.warmup()
    pools = {lv: {"speedup": [], "assisted_tokens_per_sec": [], "plain_tokens_per_sec": [], "round_s": []}
             for lv in levels}
    start = time.perf_counter()
    for r in range(pool):
        for lv in interleave.abba(levels, r):
            slow.fraction = lv
            t0 = time.perf_counter()
            runner.round()
            took = time.perf_counter() - t0
            for m in METRICS:
                pools[lv][m].append(runner.samples.metric(m)[-1])
            pools[lv]["round_s"].append(took)
        if progress:
            done = (r + 1) / pool
            el = time.perf_counter() - start
            print(f"\rmeasuring rounds: {r + 1}/{pool} per level, {el:.0f} s, about {el / done - el:.0f} s left",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return pools


def our_gate(rng, base, meas, settings, tolerance, drift):
    """One replay of the sequential gate: 'fail' if any metric fails, 'undecided' if any is
    undecided at the cap, else 'pass'; with the rounds it used."""
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, settings.looks())
    picks = [rng.randrange(len(meas["speedup"])) for _ in range(settings.rounds)]
    while True:
        at_cap = len(picks) >= settings.max_rounds
        verdicts = [stats.compare_samples(m, base[m], [meas[m][i] for i in picks], tolerance[m], alpha=alpha,
                                          at_cap=at_cap, drift_sd=drift[m][0]).verdict
                    for m in METRICS]
        if Outcome.REGRESSION in verdicts:
            return Outcome.REGRESSION, len(picks)
        if Outcome.UNDECIDED in verdicts:
            return Outcome.UNDECIDED, len(picks)
        if Outcome.INCONCLUSIVE not in verdicts:
            return Outcome.PASS, len(picks)
        picks += [rng.randrange(len(meas["speedup"])) for _ in range(settings.batch)]


def parametric_rates(rng, pools, levels, settings, tolerance, trials):
    """The gate at production sample sizes (a baseline of max_rounds rounds, the gate's own rounds up
    to the cap), drawing rounds from log-normal fits of the measured pools: each level's mean log,
    the unslowed pool's spread, and the measured between-block spread as each run's random level.
    The empirical replay above can only use half a pool as the baseline; this shows what the
    measured means and spreads give with the sizes the gate really uses."""
    zero = pools[0.0]
    sd = {m: statistics.stdev(math.log(v) for v in zero[m]) for m in METRICS}
    drift = {m: stats.drift_sd(zero[m], settings.drift_block) for m in METRICS}
    mean = {lv: {m: statistics.fmean(math.log(v) for v in pools[lv][m]) for m in METRICS} for lv in levels}
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, settings.looks())

    def run(lv, n):  # one run: its own level (between-run spread), then n rounds around it
        level = {m: mean[lv][m] + rng.gauss(0, drift[m][0]) for m in METRICS}
        return {m: [math.exp(level[m] + rng.gauss(0, sd[m])) for _ in range(n)] for m in METRICS}

    out = {}
    for lv in levels:
        counts = {Outcome.PASS: 0, Outcome.REGRESSION: 0, Outcome.UNDECIDED: 0}
        used = []
        for _ in range(trials):
            base = run(0.0, settings.max_rounds)
            tol = tolerance or {m: stats.calibrated_tolerance(base[m], cap=settings.max_rounds, alpha=alpha,
                                                             drift=drift[m][0], floor=settings.tolerance_floor)
                                for m in METRICS}
            verdict, rounds = our_gate(rng, base, run(lv, settings.max_rounds), settings, tol, drift)
            counts[verdict] += 1
            used.append(rounds)
        out[lv] = {"fail": counts[Outcome.REGRESSION] / trials, "undecided": counts[Outcome.UNDECIDED] / trials,
                   "rounds": statistics.fmean(used)}
    return out


def benchmark_compare_fail(rng, base_times, meas, rounds, tolerance):
    """pytest-benchmark's rule for --benchmark-compare-fail=mean:T% on `rounds` pedantic rounds."""
    current = [meas["round_s"][rng.randrange(len(meas["round_s"]))] for _ in range(rounds)]
    return statistics.fmean(current) > statistics.fmean(base_times) * (1 + tolerance)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="smollm2-135m+self")
    p.add_argument("--precisions", default=None, help="target+draft, e.g. bf16+w8af32 (default: the pair's)")
    p.add_argument("--slowdowns", default="0,0.05,0.10,0.25")
    p.add_argument("--pool", type=int, default=24, help="measured rounds per level")
    p.add_argument("--trials", type=int, default=2000, help="gate replays per level")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--from-json", type=Path, default=None, help="replay pools saved by an earlier --json")
    return p.parse_args(argv)


def combination(matrix, args, settings):
    """The pair at --precisions (default: its choice for this CPU class) as a greedy CPU perf combination."""
    return combinations.of_pair(matrix, args.pair, settings, precisions=args.precisions or CHOSEN,
                                given_by="benchmarks/gate_power.py")


def pools_for(matrix, combo, settings, levels, args):
    """(pools, seconds measuring): replayed from --from-json, else measured (and saved first with --json,
    so a later --from-json replays them without measuring again)."""
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        return {float(k): v for k, v in saved["pools"].items()}, saved["measure_s"]
    t0 = time.perf_counter()
    pools = measure_pools(matrix, combo, settings, levels, args.pool)
    measure_s = time.perf_counter() - t0
    if args.json:
        jsonio.atomic_write_text(args.json, json.dumps({"combination": combo.id, "measure_s": measure_s,
                                                        "pools": {str(k): v for k, v in pools.items()}}, indent=1))
    return pools, measure_s


class Calibration:
    """The between-run spread from the unslowed rounds in time order, and the tolerance an update
    would store from a baseline's own rounds (as --update-baselines calibrates it)."""

    def __init__(self, zero, settings):
        self.settings = settings
        self.alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, settings.looks())
        self.drift = {m: stats.drift_sd(zero[m], settings.drift_block) for m in METRICS}

    def tolerances(self, rounds):
        s = self.settings
        return {m: stats.calibrated_tolerance(rounds[m], cap=s.max_rounds, alpha=self.alpha, drift=self.drift[m][0],
                                              floor=s.tolerance_floor) for m in METRICS}


def print_pools(combo, zero, settings, cal, calibrated, args, round_s, measure_s):
    print(f"\nGate power for {combo.id}: {len(zero['speedup'])} measured rounds per level, {args.trials} replays; "
          f"gate rounds {settings.rounds} (+{settings.batch}) up to {settings.max_rounds}; one round = "
          f"{settings.prompts} prompt(s) x plain+assisted, {settings.max_new_tokens} tokens")
    for m in METRICS:
        print(f"  {m}: A/A CV {descriptive.cv(zero[m]):.1%}, between-block spread {cal.drift[m][0]:.1%} "
              f"(blocks of {settings.drift_block}, {cal.drift[m][1]} df), tolerance calibrated on all of them "
              f"{calibrated[m]:.0%}")
    print(f"median round time {round_s:.1f} s; measuring took {measure_s / 60:.1f} min\n")


def replay_level(rng, lv, pools, settings, cal, fixed, trials):
    """One slowdown level replayed `trials` times: our gate at the fixed and the calibrated tolerance,
    and pytest-benchmark's rule. The baseline is a random half of the unslowed rounds; for the 0%
    level the other half is what is measured."""
    zero = pools[0.0]
    n0 = len(zero["speedup"])
    counts = {"fixed": {}, "calibrated": {}}
    used = {"fixed": [], "calibrated": []}
    bench_fails = 0
    for _ in range(trials):
        idx = list(range(n0))
        rng.shuffle(idx)
        half = n0 // 2
        base = {m: [zero[m][i] for i in idx[:half]] for m in (*METRICS, "round_s")}
        meas = pools[lv] if lv else {m: [zero[m][i] for i in idx[half:]] for m in (*METRICS, "round_s")}
        for name, tol in (("fixed", fixed), ("calibrated", cal.tolerances(base))):
            verdict, rounds = our_gate(rng, base, meas, settings, tol, cal.drift)
            counts[name][verdict] = counts[name].get(verdict, 0) + 1
            used[name].append(rounds)
        bench_fails += benchmark_compare_fail(rng, base["round_s"], meas, settings.rounds, fixed["speedup"])
    return counts, used, bench_fails


def replay_table(rng, levels, pools, settings, cal, args, round_s):
    """Detection and false-alarm rates per level, printed as a table; the rows for --json."""
    fixed = {m: args.tolerance for m in METRICS}
    header = (f"{'slowdown':>8} | {'ours @' + format(args.tolerance, '.0%') + ' fail/undecided':>26} "
              f"{'time/gate':>9} | {'ours @calibrated fail/undec.':>28} {'time/gate':>9} | "
              f"{'pytest-benchmark mean:' + format(args.tolerance, '.0%') + ' fails':>30} {'time':>6}")
    print(header)
    print("-" * len(header))
    table = []
    for lv in levels:
        counts, used, bench_fails = replay_level(rng, lv, pools, settings, cal, fixed, args.trials)
        row = {"slowdown": lv, "pytest_benchmark_fail": bench_fails / args.trials,
               "pytest_benchmark_minutes": settings.rounds * round_s / 60}
        cells = []
        for name in ("fixed", "calibrated"):
            fail = counts[name].get(Outcome.REGRESSION, 0) / args.trials
            und = counts[name].get(Outcome.UNDECIDED, 0) / args.trials
            minutes = statistics.fmean(used[name]) * round_s / 60
            row[name] = {"fail": fail, "undecided": und, "minutes": minutes}
            cells += [f"{fail:>6.1%} / {und:>5.1%}", f"{minutes:>7.1f} m"]
        table.append(row)
        print(f"{lv:>8.0%} | {cells[0]:>26} {cells[1]:>9} | {cells[2]:>28} {cells[3]:>9} | "
              f"{bench_fails / args.trials:>30.1%} {settings.rounds * round_s / 60:>4.1f} m")
    print("\n(0% row: false alarms; other rows: detection. 'undecided': still unresolved at the cap (a warning, "
          "or a failure with --perf-undecided=fail). Times: mean rounds x median round time, excluding model "
          "load and warm-up. 'calibrated': each replay calibrates from its own baseline half, as an update would.)")
    return table


def parametric_table(rng, levels, pools, settings, args, round_s, table):
    """The same rates at production sample sizes, from log-normal fits of the pools; added to `table`."""
    print(f"\nThe same at production sizes (log-normal fits of the pools; baseline {settings.max_rounds} rounds):")
    fixed_p = parametric_rates(rng, pools, levels, settings, {m: args.tolerance for m in METRICS}, args.trials)
    calib_p = parametric_rates(rng, pools, levels, settings, None, args.trials)
    for lv in levels:
        f, c = fixed_p[lv], calib_p[lv]
        print(f"{lv:>8.0%} | {f['fail']:>6.1%} / {f['undecided']:>5.1%}{'':>13} {f['rounds'] * round_s / 60:>7.1f} m | "
              f"{c['fail']:>6.1%} / {c['undecided']:>5.1%}{'':>15} {c['rounds'] * round_s / 60:>7.1f} m |")
    for row in table:
        row["parametric"] = {"fixed": fixed_p[row["slowdown"]], "calibrated": calib_p[row["slowdown"]]}


def main(argv=None) -> int:
    args = parse_args(argv)
    matrix = registry.load_matrix()
    settings = PerfSettings.from_matrix(matrix)
    combo = combination(matrix, args, settings)
    levels = [float(x) for x in args.slowdowns.split(",")]
    if 0.0 not in levels:
        levels = [0.0] + levels
    pools, measure_s = pools_for(matrix, combo, settings, levels, args)
    rng = random.Random(20261122)
    zero = pools[0.0]
    round_s = statistics.median(zero["round_s"])
    cal = Calibration(zero, settings)
    calibrated = cal.tolerances(zero)
    print_pools(combo, zero, settings, cal, calibrated, args, round_s, measure_s)
    table = replay_table(rng, levels, pools, settings, cal, args, round_s)
    parametric_table(rng, levels, pools, settings, args, round_s, table)
    if args.json:
        saved = json.loads(args.json.read_text()) if args.json.exists() else {}
        saved.update(table=table, calibrated=calibrated, drift={m: list(v) for m, v in cal.drift.items()})
        jsonio.atomic_write_text(args.json, json.dumps(saved, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
