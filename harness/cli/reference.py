"""`python -m harness reference show|move`: the commit whose performance was last accepted.

`move` moves the reference to HEAD after an A/B run of HEAD (a clean working tree) against the
current reference on the perf gate's fast combinations, prints that run, and keeps its verdicts in
baselines/reference.json with the reason. A regression blocks the move unless it is accepted
explicitly (--accept-regression), with the reason saying why.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
from harness.core.errors import BadInputError, UnsupportedHereError
from harness.perf.ab import reference, revision

MARKER = "perf and not slow"


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("reference", help="the reference commit of the A/B perf gate (baselines/reference.json)")
    rsub = r.add_subparsers(dest="reference_command", required=True)
    rsub.add_parser("show", help="the reference commit, when and why it moved, and the A/B run behind it")
    m = rsub.add_parser("move", help="move the reference to HEAD after an A/B run against the current one")
    m.add_argument("--reason", required=True, help="why the performance of HEAD is accepted (kept in the file)")
    m.add_argument("--accept-regression", action="store_true",
                   help="move even though the A/B run found a regression (say why in --reason)")
    m.add_argument("--marker", default=MARKER, help=f"which perf combinations the A/B run gates (default {MARKER!r})")


def run(args: argparse.Namespace) -> int:
    if args.reference_command == "show":
        ref = reference.read()
        print(f"reference {ref.commit} (moved {ref.moved}, previous {ref.previous or '-'}): {ref.reason}")
        for line in ref.evidence:
            print(f"  {line}")
        return 0
    return move(args)


def move(args: argparse.Namespace) -> int:
    repo = revision.repository_root(Path(harness.__file__).parent)
    tree = revision.working_tree(repo)
    if tree.label != "working tree":
        raise BadInputError("reference move: the working tree has uncommitted changes; commit them, then move the "
                           "reference to that commit")
    current = reference.read() if reference.PATH.exists() else None
    if current is not None and current.commit == tree.commit:
        print(f"HEAD {tree.commit[:12]} is already the reference")
        return 0
    evidence = ["first reference: no earlier one to compare with"] if current is None else ab_run(repo, args.marker)
    regressed = [line for line in evidence if " REGRESSION" in line or line.startswith("regression")]
    if regressed and not args.accept_regression:
        print("\n".join(evidence))
        raise BadInputError("reference move: the A/B run found a regression (above); fix it, or pass "
                           "--accept-regression with a --reason that says why it is accepted")
    new = reference.moved_to(tree.commit, args.reason, current, evidence)
    reference.write(new)
    print("\n".join(evidence))
    print(f"wrote {reference.PATH}: reference {current.commit[:12] if current else '-'} -> {tree.commit[:12]}; "
          "review and commit it")
    return 0


def ab_run(repo: Path, marker: str) -> list[str]:
    """Run the A/B gate of the working tree against the reference; its verdict lines."""
    with tempfile.TemporaryDirectory(prefix="reference-move-") as out:
        cmd = [sys.executable, "-m", "pytest", str(repo / "tests" / "perf"), "-m", marker, "-p", "no:cacheprovider",
               "--perf-against", reference.NAME, "--perf-report-dir", out, "-q"]
        print("$ " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=repo)
        report = Path(out) / "results.json"
        if not report.exists():
            raise UnsupportedHereError(f"reference move: the A/B run measured nothing (pytest exit {done.returncode}); "
                               "the reference was not moved")
        results = json.loads(report.read_text())["results"]
    if done.returncode != 0:
        results.append({"verdict": "regression", "combination": f"the A/B run (pytest exit {done.returncode}: a "
                        "regression, an error or an undecided gate; see above)", "decisions": {}})
    lines = []
    for r in results:
        changes = ", ".join(f"{m} {d['verdict'].upper()} {d['change'] * 100:+.1f}%"
                            for m, d in r.get("decisions", {}).items())
        base, rounds = (r.get("ab") or {}).get("base", "?"), len(r.get("rounds", []))
        lines.append(f"{r['verdict']}: {r['combination']} vs {base}, {rounds} rounds: {changes}")
    return lines
