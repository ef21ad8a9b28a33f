"""How well does the A/B gate tell a slower commit from noise on this machine?

Runs whole A/B gates (harness/perf/ab/gate.py) of the working tree against a base revision, with a
slowdown planted in the candidate's target forward pass only (0 = A/A), and records each finished
gate to a JSON-lines file, so an interrupted run resumes where it stopped. Then prints, per
planted level: detection (REGRESSION) and false-alarm rates, UNDECIDED, rounds and minutes per gate;
and the same rates from a simulation that resamples the measured A/A per-round ratios (shifted by
each level) through the gate's own sequential procedure, for rates tighter than a few real gates give.

    python benchmarks/ab_power.py --pair smollm2-135m+self --levels 0,0.10 --gates 5
    python benchmarks/ab_power.py --pair qwen-coder-1.5b+0.5b --levels 0,0.05,0.10,0.25 --gates 10   # hours
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
from pathlib import Path

from harness.core import registry
from pytest_benchmark.utils import parse_compare_fail

from harness.perf.ab import duet, paired, revision
from harness.perf.stored import stats
from harness.perf.outcome import Outcome, settled
from harness.perf.ab.gate import ABGate, ABSettings
from harness.perf.ab.arms import Arm
from harness.perf.combinations import Combination, PerfSettings
from harness.perf.record import METRICS

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="smollm2-135m+self")
    p.add_argument("--against", default="HEAD", help="base revision (default HEAD: the same code, A/A at level 0)")
    p.add_argument("--levels", default="0,0.10", help="slowdowns planted in the candidate's target forward")
    p.add_argument("--gates", type=int, default=5, help="real gates per level")
    p.add_argument("--tolerance", type=float, default=ABSettings().tolerance)
    p.add_argument("--trials", type=int, default=5000, help="simulated gates per level")
    p.add_argument("--duet", choices=duet.CHOICES, default="auto",
                   help="the gate's --perf-duet: arms side by side (on), in turn (off), auto (side by side on 2 cores)")
    p.add_argument("--restart-every", type=int, default=ABSettings().restart_every, help="rounds per worker pair")
    p.add_argument("--condition", default="quiet", help="what else ran on the host (a label kept in each row)")
    p.add_argument("--out", type=Path, default=Path("results/ab_power.jsonl"), help="finished gates (resumed)")
    return p.parse_args(argv)


def combination(matrix: registry.Matrix, pair_name: str) -> Combination:
    pair = matrix.pair(pair_name)
    return Combination(pair=pair.name, target_precision=pair.target_precision, draft_precision=pair.draft_precision,
                       platform="cpu", device="cpu", decoding="greedy", k=pair.num_assistant_tokens, mode=pair.mode)


def run_gate(matrix, combo, settings, trees, level, tolerance, seed, plan, restart_every) -> dict:
    base, candidate = trees

    def load_request(arm: str) -> dict:
        return {"op": "load", "matrix": str(matrix.path), "combination": dataclasses.asdict(combo),
                "settings": dataclasses.asdict(settings),
                "plant": {"fraction": level, "into": "target"} if arm == "candidate" and level else None}

    start = time.perf_counter()

    def progress(done: int, decisions) -> None:
        print(f"  round {done} ({(time.perf_counter() - start) / 60:.1f} min)", file=sys.stderr, flush=True)

    ab = ABSettings(tolerance=tolerance, seed=seed, restart_every=restart_every)
    result = ABGate(combo, settings, Arm("base", base, env=plan.env()), Arm("candidate", candidate, env=plan.env()),
                    load_request, ab, plan=plan).run(progress)
    return {"level": level, "outcome": result.outcome.value, "rounds": result.rounds, "redone": result.redone,
            "restart_every": ab.restart_every, "mode": result.mode, "cpu_class": matrix.cpu_class,
            "minutes": (time.perf_counter() - start) / 60, "ratios": result.ratios,
            "arms": {arm: {m: [s.metric(m) for s in samples] for m in METRICS} for arm, samples in result.samples.items()},
            "verdicts": {m: d.verdict.value for m, d in result.decisions.items()},
            "cores": {arm: [s.cpu for s in samples] for arm, samples in result.samples.items()}}


def simulate(aa_ratios: list[dict[str, float]], level: float, settings: PerfSettings, tolerance: float,
             trials: int, rng: random.Random) -> dict[str, float]:
    """Gates replayed on resampled A/A rounds, every ratio scaled by (1 - level) for plain and assisted
    tokens/s (a slower target forward slows both; the speedup moves less and is left as measured)."""
    design = ABSettings(tolerance=tolerance).design(settings)
    counts = {"regression": 0, "undecided": 0, "rounds": 0}
    for _ in range(trials):
        rounds = [rng.choice(aa_ratios) for _ in range(settings.max_rounds)]
        n = settings.rounds
        while True:
            verdicts = [paired.decide(m, [r[m] * ((1 - level) if m != "speedup" else 1) for r in rounds[:n]],
                                      design, at_cap=n >= settings.max_rounds).verdict
                        for m in METRICS]
            if settled(verdicts):
                break
            n = min(n + settings.batch, settings.max_rounds)
        counts["regression"] += Outcome.REGRESSION in verdicts
        counts["undecided"] += Outcome.REGRESSION not in verdicts and Outcome.UNDECIDED in verdicts
        counts["rounds"] += n
    return {"regression": counts["regression"] / trials, "undecided": counts["undecided"] / trials,
            "rounds": counts["rounds"] / trials}


def main(argv=None) -> int:
    args = parse_args(argv)
    matrix = registry.load_matrix()
    combo = combination(matrix, args.pair)
    settings = PerfSettings.from_matrix(matrix)
    repo = revision.repository_root(REPO)
    trees = (revision.checkout(repo, args.against), revision.working_tree(repo))
    levels = [float(x) for x in args.levels.split(",")]
    done = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    plan = duet.plan(args.duet)
    done = [g for g in done if g.get("combination") == combo.id and g.get("mode", "interleaved") == plan.mode
            and g.get("condition", "quiet") == args.condition and g.get("cpu_class", matrix.cpu_class) == matrix.cpu_class]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.gates):  # levels interleaved, so a slow hour of the machine hits every level
        for level in levels:
            if sum(g["level"] == level for g in done) > i:
                continue
            print(f"[{combo.id}] level {level:.0%}: gate {i + 1}/{args.gates}", file=sys.stderr, flush=True)
            gate = {"combination": combo.id, "condition": args.condition,
                    **run_gate(matrix, combo, settings, trees, level, args.tolerance, seed=i, plan=plan,
                               restart_every=args.restart_every)}
            with open(args.out, "a", encoding="utf-8") as fh:  # one line per finished gate: resumable
                fh.write(json.dumps(gate) + "\n")
            done.append(gate)
            print(f"  {gate['outcome']} after {gate['rounds']} rounds, {gate['minutes']:.1f} min", file=sys.stderr)
    report(done, levels, settings, args)
    compare_gates(done, levels, settings, args.tolerance)
    return 0


def report(done: list[dict], levels: list[float], settings: PerfSettings, args) -> None:
    aa = [dict(zip(METRICS, values)) for g in done if g["level"] == 0
          for values in zip(*(g["ratios"][m] for m in METRICS))]
    print(f"\nA/B gate power, {done[0]['combination'] if done else args.pair}, tolerance {args.tolerance:.0%} "
          f"(regression: significant and beyond -{args.tolerance / 2:.0%}; pass: -{args.tolerance / 2:.0%} ruled out), rounds {settings.rounds} (+{settings.batch}) up to {settings.max_rounds}")
    print(f"{'slowdown':>8} | {'real gates':>10} {'regression':>10} {'undecided':>9} {'rounds':>6} {'min/gate':>8} | "
          f"{'simulated regression':>20} {'undecided':>9} {'rounds':>6}")
    rng = random.Random(20261123)
    for level in levels:
        gates = [g for g in done if g["level"] == level]
        n = len(gates) or 1
        sim = simulate(aa, level, settings, args.tolerance, args.trials, rng) if aa else None
        real = (f"{len(gates):>10} {sum(g['outcome'] == 'regression' for g in gates) / n:>10.0%} "
                f"{sum(g['outcome'] == 'undecided' for g in gates) / n:>9.0%} "
                f"{sum(g['rounds'] for g in gates) / n:>6.1f} {sum(g['minutes'] for g in gates) / n:>8.1f}")
        simulated = (f"{sim['regression']:>20.1%} {sim['undecided']:>9.1%} {sim['rounds']:>6.1f}" if sim
                     else f"{'(needs A/A gates)':>37}")
        print(f"{level:>8.0%} | {real} | {simulated}")
    spread = {m: math.sqrt(sum(math.log(r[m]) ** 2 for r in aa) / max(1, len(aa) - 1)) for m in METRICS} if aa else {}
    print("A/A per-round spread of ln(candidate/base): " + ", ".join(f"{m} {v:.1%}" for m, v in spread.items()))


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
    print(f"{'slowdown':>8} | {'gates':>5} {'A/B gate':>8} {'stored-baseline gate':>20} {'(its tolerance)':>15} "
          f"{'pytest-benchmark mean:' + str(round(tolerance * 100)) + '%':>25}")
    for level in levels:
        rows = [g for g in gates if g["level"] == level]
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
        print(f"{level:>8.0%} | {n:>5} {ab / n:>8.0%} {stored_fail / n:>20.0%} {statistics.median(widest):>15.0%} "
              f"{benchmark_fail / n:>25.0%}")


if __name__ == "__main__":
    sys.exit(main())
