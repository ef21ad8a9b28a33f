"""How long a gate's worker pair takes to start, HEAD's code against the working tree's: both arms of
the pair's combination started, pinned, loaded and warmed up side by side, as a gate starts them and
restarts them every few rounds (harness/perf/ab/gate.py `ABGate.start`); HEAD's pair and the working
tree's in turn, so that both meet the same hours of the host. Appends one row a start to --out and
prints, per comparison (the HEAD commit both trees stood on) and per tree, each start's seconds and
their median. Where a start's time goes and what it costs a gate: docs/perf-gate.md, "A round", its
restart paragraph.

    python benchmarks/worker_start.py --starts 3 --out benchmarks/data/worker_start_avx2.jsonl
    python benchmarks/worker_start.py --out benchmarks/data/worker_start_avx2.jsonl --show   # the kept rows
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import ab_power
from harness.perf.ab import duet, revision
from harness.perf.ab.arms import Arm
from harness.perf.ab.gate import ABGate, ABSettings
from harness.perf.ab.loadguard import noise_pids
from harness.perf.combinations import PerfSettings
from harness.workload import registry


def start_seconds(matrix, combo, settings, tree: revision.Tree, plan: duet.Plan) -> float:
    """Seconds from starting both arms on `tree`'s code until both have loaded and warmed up."""
    gate = ABGate(combo, settings, Arm("base", tree, env=plan.env()), Arm("candidate", tree, env=plan.env()),
                  ab_power.load_requests(matrix, combo, settings), ABSettings(), plan=plan)
    start = time.perf_counter()
    try:
        gate.start()
        return time.perf_counter() - start
    finally:
        gate.close()


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="qwen-coder-1.5b+0.5b")
    p.add_argument("--starts", type=int, default=3, help="starts of each tree's pair, in turn (default 3)")
    p.add_argument("--out", type=Path, required=True, help="JSON lines: one row a start, appended")
    p.add_argument("--show", action="store_true", help="print the kept rows only")
    args = p.parse_args(argv)
    if args.starts < 1:
        p.error(f"--starts {args.starts}: at least 1")
    if not args.show:
        matrix = registry.load_matrix()
        settings = PerfSettings.from_matrix(matrix)
        combo = ab_power.combination(matrix, args.pair, settings)
        repo = revision.repository_root(ab_power.REPO)
        trees = (revision.checkout(repo, "HEAD"), revision.working_tree(repo))
        plan = duet.plan("on")
        condition = "noisy" if noise_pids() else "quiet"
        for i in range(args.starts):
            for tree in trees:
                seconds = start_seconds(matrix, combo, settings, tree, plan)
                row = {"combination": combo.id, "cpu_class": matrix.cpu_class, "condition": condition,
                       "tree": "HEAD" if tree is trees[0] else tree.label, "commit": tree.commit,
                       "seconds": round(seconds, 2), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                print(f"start {i + 1}/{args.starts}, {row['tree']}: {seconds:.1f} s", file=sys.stderr, flush=True)
                ab_power.kept_rows(args.out, row)
    show(ab_power.kept_rows(args.out, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
