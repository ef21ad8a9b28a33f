"""`python -m harness sandbox info|selftest`: the containment backend here, hostile completions, canonical solutions."""

from __future__ import annotations

import argparse
import os
import time

from harness.cli.options import sandbox_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    sb = sub.add_parser("sandbox", help="the code sandbox: which backend runs here, and its self-test")
    sbsub = sb.add_subparsers(dest="sandbox_command", required=True)
    sbsub.add_parser("info", help="the containment backend this machine gives and what it enforces")
    st = sbsub.add_parser("selftest", help="run the hostile completions and the canonical solutions")
    sandbox_options(st)
    st.add_argument("--skip-canonical", action="store_true", help="only the hostile completions")


def run(args: argparse.Namespace) -> int:
    from harness.sandbox import execute as sandbox

    if args.sandbox_command == "info":
        for name in sandbox.BACKENDS:
            ok, reason = sandbox._available(name)
            print(f"{name:8} {'works' if ok else 'unavailable: ' + reason}")
        try:
            chosen = sandbox.select_backend(None)
        except sandbox.SandboxUnavailable as exc:
            print(f"in use: none can run model-written code: {exc}")
            return 1
        print(f"in use: {chosen}: {sandbox.backend_note(chosen)}")
        print(f"pids cgroup per run: {'yes' if sandbox._pids_cgroup_root() else 'no (RLIMIT_NPROC only)'}")
        return 0
    from harness.accuracy import humaneval
    from harness.sandbox import cases as sandbox_cases

    sandbox.require_code_execution(args.allow_code_execution)
    backend = sandbox.select_backend(args.sandbox)
    print(f"sandbox: {sandbox.backend_note(backend)}")
    print(f"{'case':24} {'expected':18} {'status':10} {'files':9} {'canary':7} {'litter':6} {'leftover':9} "
          f"{'time':>6}  result")

    def show(o: "sandbox_cases.CaseOutcome") -> None:
        case = next(c for c in sandbox_cases.CASES if c.name == o.case)
        print(f"{o.case:24} {'/'.join(case.expect):18} {o.status:10} {'intact' if o.files_intact else 'CHANGED':9} "
              f"{'LEAKED' if o.leaked else 'kept':7} {len(o.litter):<6} {len(o.leftover_processes):<9} "
              f"{o.duration_s:6.2f}  {o.result[:90]}{'' if o.ok else '   <-- FAILED'}", flush=True)

    outcomes = sandbox_cases.selftest(backend, progress=show)
    bad = [o.case for o in outcomes if not o.ok]
    ok = not bad
    if not args.skip_canonical:
        checked = canonical_check(humaneval, sandbox, backend)
        ok = ok and checked
    print(f"self-test {'passed' if ok else 'FAILED'}" + (f": {', '.join(bad)}" if bad else ""))
    return 0 if ok else 1


def canonical_check(humaneval, sandbox, backend: str) -> bool:
    """Every canonical solution passes, every deliberately wrong one ('return None') fails."""
    start = time.perf_counter()
    probs = humaneval.problems()
    rows = [(tid, p["canonical_solution"], True) for tid, p in probs.items()]
    rows += [(tid, "    return None\n", False) for tid, p in probs.items()]
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda r: humaneval.check_completion(probs[r[0]], r[1], backend=backend), rows))
    good = [r for (tid, _, want), r in zip(rows, results) if want]
    wrong = [r for (tid, _, want), r in zip(rows, results) if not want]
    bad_good = [tid for (tid, _, want), r in zip(rows, results) if want and not r.passed]
    bad_wrong = [tid for (tid, _, want), r in zip(rows, results) if not want and r.passed]
    print(f"canonical solutions: {sum(r.passed for r in good)}/{len(good)} passed; deliberately wrong "
          f"('return None'): {sum(not r.passed for r in wrong)}/{len(wrong)} failed ({time.perf_counter() - start:.1f} s)")
    for tid in bad_good:
        print(f"  canonical {tid} did not pass")
    for tid in bad_wrong:
        print(f"  wrong {tid} passed")
    return not bad_good and not bad_wrong

