"""What the sandbox costs per program: this tree against another revision, interleaved.

Each arm is LABEL=REV:BACKEND (REV `.` is the working tree; another revision is checked out in a
worktree, as the A/B gate does). Every round runs each arm once, in alternating order, in its own
process: the same HumanEval canonical solutions, one after another, each through the arm's
`check_program` (process start, containment, verdict, clean-up). Prints per arm the median
milliseconds per program over rounds, and each arm's ratio to the first with a 95% interval over
the rounds' paired ratios.

    python benchmarks/sandbox_overhead.py --arms before=HEAD:unshare after=.:unshare --rounds 10
    python benchmarks/sandbox_overhead.py --arms unshare=.:unshare bwrap=.:bwrap --json results/sandbox_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from harness.perf.errorrates import geometric_interval

REPO = Path(__file__).resolve().parents[1]

# Runs in the arm's tree: the first N canonical solutions, serially; prints seconds per program.
DRIVER = """
import inspect, json, sys, time
from harness.accuracy import humaneval
from harness.sandbox import execute as sandbox
backend, n = sys.argv[1], int(sys.argv[2])
probs = list(humaneval.problems().values())[:n]
# a revision whose check runs apart from the program takes the prompt as trusted context
context = "context" in inspect.signature(sandbox.check_program).parameters
sandbox.check_program("def f(x):\\n    return x\\n", "def check(c):\\n    assert c(1) == 1\\n", "f",
                      backend=backend, allow=True)  # the backend's probe and imports, not timed
times = []
for p in probs:
    start = time.perf_counter()
    r = sandbox.check_program(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"],
                              backend=backend, allow=True, **({"context": p["prompt"]} if context else {}))
    times.append(time.perf_counter() - start)
    if not r.passed:
        raise SystemExit(f"{p['task_id']} did not pass under {backend}: {r.result}")
print(json.dumps(times))
"""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", nargs="+", default=["before=HEAD:unshare", "after=.:unshare"],
                   help="LABEL=REV:BACKEND, the first is the reference (REV . = this working tree)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--programs", type=int, default=40, help="canonical solutions per arm and round")
    p.add_argument("--json", type=Path, default=None, help="write the per-round figures here")
    args = p.parse_args(argv)
    if args.rounds < 2 or args.programs < 1:
        p.error("--rounds needs at least 2 and --programs at least 1")
    return args


def arm_tree(rev: str) -> Path:
    if rev == ".":
        return REPO
    from harness.perf.ab import revision

    return revision.checkout(revision.repository_root(REPO), rev).path


def run_arm(tree: Path, backend: str, programs: int) -> list[float]:
    proc = subprocess.run([sys.executable, "-c", DRIVER, backend, str(programs)], cwd=tree, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)})
    if proc.returncode != 0:
        raise SystemExit(f"arm in {tree} ({backend}) failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    arms = []
    for spec in args.arms:
        label, _, rest = spec.partition("=")
        rev, _, backend = rest.rpartition(":")
        if not label or not rev or not backend:
            raise SystemExit(f"--arms {spec!r}: expected LABEL=REV:BACKEND, e.g. after=.:unshare")
        arms.append((label, arm_tree(rev), backend))
    per_round: dict[str, list[float]] = {label: [] for label, _, _ in arms}
    for i in range(args.rounds):
        order = arms if i % 2 == 0 else arms[::-1]
        for label, tree, backend in order:
            times = run_arm(tree, backend, args.programs)
            per_round[label].append(statistics.median(times) * 1000)
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{lab} {per_round[lab][-1]:.1f} ms"
                                                          for lab, _, _ in arms), file=sys.stderr, flush=True)
    ref = arms[0][0]
    print(f"{'arm':24} {'median ms/program':>18} {'ratio to ' + ref:>16} {'95% interval':>18}")
    for label, _, backend in arms:
        ratios = [a / b for a, b in zip(per_round[label], per_round[ref])]
        low, high = geometric_interval(ratios) or (1.0, 1.0)
        interval = f"[{low:.3f}, {high:.3f}]" if label != ref else "(reference)"
        print(f"{label + ' (' + backend + ')':24} {statistics.median(per_round[label]):18.1f} "
              f"{statistics.geometric_mean(ratios):16.3f} {interval:>18}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"arms": args.arms, "programs": args.programs, "ms_per_program": per_round},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
