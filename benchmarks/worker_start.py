"""How long a gate's worker pair takes to start, HEAD's code against the working tree's: both arms of
the pair's combination started, pinned, loaded and warmed up side by side, as a gate starts them and
restarts them every few rounds (harness/perf/ab/gate.py `ABGate.start`); HEAD's pair and the working
tree's in turn, so that both meet the same hours of the host. Appends one row a start to --out and
prints, per comparison (the HEAD commit both trees stood on) and per tree, each start's seconds and
their median. Where a start's time goes and what it costs a gate: docs/perf-gate.md, "A round", its
restart paragraph. With --rounds N each start also runs N rounds side by side, as the gate's first
rounds after a (re)start, and the row keeps each arm's metrics, gated phases and page faults by round;
--show then prints how far each tree's first round stood from the rounds after it, and at each round
after a start in how many arms the round took over 100 page faults, touching memory anew
(docs/gate-studies.md, "The first round of a worker").

    python benchmarks/worker_start.py --starts 3 --out benchmarks/data/worker_start_avx2.jsonl
    python benchmarks/worker_start.py --starts 5 --rounds 4 --out benchmarks/data/first_round_avx512-bf16.jsonl
    python benchmarks/worker_start.py --out benchmarks/data/worker_start_avx2.jsonl --show   # the kept rows
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import ab_power
from noise_sources import FAULTS_NOTED, PAGE_FAULTS
from harness.perf.ab import duet, revision
from harness.perf.ab.arms import Arm
from harness.perf.ab.gate import ABGate, ABSettings
from harness.perf.ab.loadguard import LoadGuard, noise_pids
from harness.perf.combinations import PerfSettings
from harness.perf.record import GATED_PHASES, METRICS
from harness.workload import registry


def start(matrix, combo, settings, tree: revision.Tree, plan: duet.Plan, rounds: int,
          noise: tuple[int, ...]) -> tuple[float, dict, int]:
    """Seconds from starting both arms on `tree`'s code until both have loaded and warmed up; then
    `rounds` rounds side by side, as a gate's first rounds after a (re)start (a round the load guard
    finds disturbed is measured again, a deliberate neighbour's load, `noise`, counted as the
    study's own): each arm's metrics (METRICS) and gated phases (GATED_PHASES, by their statistic)
    by round, arm name -> name -> values; and the rounds redone."""
    gate = ABGate(combo, settings, Arm("base", tree, env=plan.env()), Arm("candidate", tree, env=plan.env()),
                  ab_power.load_requests(matrix, combo, settings), ABSettings(), guard=LoadGuard(noise=noise),
                  plan=plan)
    began = time.perf_counter()
    try:
        gate.start()
        seconds = time.perf_counter() - began
        for index in range(rounds):
            gate.round(index)
    except BaseException:  # as the gate: a worker mid-request is killed, not asked to quit
        gate.close(ask=False)
        raise
    gate.close()
    measured = {arm: {**{name: [r.metric(name) if name in METRICS else r.phase_ms(name) for r in samples]
                         for name in (*METRICS, *GATED_PHASES)},
                      PAGE_FAULTS: [r.page_faults for r in samples]}
                for arm, samples in gate.samples.items()}
    return seconds, measured, gate.redone


def first_round(rows: list[dict]) -> str | None:
    """How far the first round after a start stood from the rounds after it, over the rows' arms:
    per metric or phase, the mean and sd of ln(first / geometric mean of the rest); tokens/s and the
    speedup are rates (below 0: the first round slower), the phases milliseconds (above 0: slower)."""
    gaps: dict[str, list[float]] = {}
    for r in rows:
        for arm in (r.get("rounds") or {}).values():
            for name, values in arm.items():
                if name != PAGE_FAULTS and len(values) > 1 and all(v for v in values):
                    rest = statistics.fmean(math.log(v) for v in values[1:])
                    gaps.setdefault(name, []).append(math.log(values[0]) - rest)
    if not gaps:
        return None
    return "; ".join(f"{name} {100 * statistics.fmean(g):+.1f}% (sd {100 * statistics.stdev(g):.1f}%, {len(g)} arms)"
                     if len(g) > 1 else f"{name} {100 * g[0]:+.1f}% (1 arm)" for name, g in gaps.items())


def faults_by_round(rows: list[dict]) -> str | None:
    """Per round after a start: in how many arms its generating thread took over FAULTS_NOTED page
    faults (touched that much memory for the first time), and the most any took; rows kept before
    rounds counted them have none."""
    counts = [arm[PAGE_FAULTS] for row in rows for arm in (row.get("rounds") or {}).values()
              if arm.get(PAGE_FAULTS) and None not in arm[PAGE_FAULTS]]
    if not counts:
        return None
    places = range(max(len(c) for c in counts))
    return ", ".join(f"round {i + 1}: {sum(1 for c in counts if len(c) > i and c[i] > FAULTS_NOTED)} of "
                     f"{sum(1 for c in counts if len(c) > i)} arms (most {max(c[i] for c in counts if len(c) > i)})"
                     for i in places)


def show(rows: list[dict]) -> None:
    """Per comparison (combination, class, host condition and the HEAD commit both trees stood on),
    each tree's starts and their median: a study made at another commit is another comparison."""
    grouped: dict[tuple[str, str, str, str], dict[str, list[dict]]] = {}
    for r in rows:
        key = (r["combination"], r["cpu_class"], r["condition"], r["commit"])
        grouped.setdefault(key, {}).setdefault(r["tree"], []).append(r)
    for (combination, cpu_class, condition, commit), trees in grouped.items():
        print(f"{combination}, {cpu_class}, {condition}, HEAD {commit[:12]}: seconds a worker pair took to start")
        for tree, took in trees.items():
            print(f"  {tree:45} " + " ".join(f"{r['seconds']:.1f}" for r in took)
                  + f"; median {statistics.median(r['seconds'] for r in took):.1f}")
            if gaps := first_round(took):
                print(f"  {'':45} first round against the rest: {gaps}")
            if faults := faults_by_round(took):
                print(f"  {'':45} page faults over {FAULTS_NOTED} in a round: {faults}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="qwen-coder-1.5b+0.5b")
    p.add_argument("--starts", type=int, default=3, help="starts of each tree's pair, in turn (default 3)")
    p.add_argument("--out", type=Path, required=True, help="JSON lines: one row a start, appended")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds side by side after each start, kept by arm and round (default 0)")
    p.add_argument("--show", action="store_true", help="print the kept rows only")
    args = p.parse_args(argv)
    if args.starts < 1:
        p.error(f"--starts {args.starts}: at least 1")
    every = ABSettings().restart_every
    if args.rounds < 0 or args.rounds == 1 or args.rounds > every:
        p.error(f"--rounds {args.rounds}: 0, or 2 to {every} (the first round is compared with those after it, "
                f"and a gate restarts its workers every {every} rounds)")
    if not args.show:
        matrix = registry.load_matrix()
        settings = PerfSettings.from_matrix(matrix)
        combo = ab_power.combination(matrix, args.pair, settings)
        repo = revision.repository_root(ab_power.REPO)
        trees = (revision.checkout(repo, "HEAD"), revision.working_tree(repo))
        plan = duet.plan("on")
        noise = noise_pids()
        condition = "noisy" if noise else "quiet"
        for i in range(args.starts):
            for tree in trees:
                seconds, rounds, redone = start(matrix, combo, settings, tree, plan, args.rounds, noise)
                row = {"combination": combo.id, "cpu_class": matrix.cpu_class, "condition": condition,
                       "cpu": ab_power.host_cpu(), "tree": "HEAD" if tree is trees[0] else tree.label, "commit": tree.commit,
                       "seconds": round(seconds, 2), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                if args.rounds:
                    row.update(rounds=rounds, redone=redone)
                print(f"start {i + 1}/{args.starts}, {row['tree']}: {seconds:.1f} s", file=sys.stderr, flush=True)
                ab_power.kept_rows(args.out, row)
    show(ab_power.kept_rows(args.out, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
