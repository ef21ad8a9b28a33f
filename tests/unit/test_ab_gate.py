"""The A/B gate end to end through pytest (a child run) on tiny local models: the working tree
against HEAD, unchanged and with a slowdown planted in the candidate's workers only; bad
revisions are one-line usage errors; no worker outlives the run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import write_local_matrix

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / "tests" / "perf" / "test_perf_gate.py"
CID = "tiny+draft:fp32+fp32:cpu:greedy:k4"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    yield write_local_matrix(root), root
    for tree in (root / "cache" / "worktrees").glob("*/*"):  # the base worktrees the runs made
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def ab(tiny, *args: str, tolerance: str = "0.5") -> tuple[subprocess.CompletedProcess, dict]:
    matrix, root = tiny
    cmd = [sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "-k", "tiny+draft",
           "--perf-matrix", str(matrix), "--perf-report-dir", str(root / "reports"), "--perf-against", "HEAD",
           "--perf-tolerance", tolerance, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})
    report = root / "reports" / "results.json"
    results = json.loads(report.read_text())["results"] if report.exists() else []
    return r, next((x for x in results if x["combination"] == CID), {})


def workers_left() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if re.search(r"harness\.perf\.(ab\.)?worker", line)]


def test_the_verdict_moves_with_a_slowdown_planted_in_the_candidate(tiny):
    for _ in range(3):  # a tiny model's round is milliseconds: a busy spell earns a re-run
        same, rec = ab(tiny, "--perf-max-repeats", "24")
        if rec.get("verdict") == "pass":
            break
    assert same.returncode == 0 and rec["verdict"] == "pass", same.stdout[-3000:]
    assert rec["gate"] == "ab" and rec["ab"]["base"].startswith("HEAD ") and len(rec["rounds"]) >= 3
    assert set(rec["ab"]["ratios"]) == {"speedup", "assisted_tokens_per_sec", "plain_tokens_per_sec"}
    assert rec["ab"]["behaviour_changes"] == []  # one code, one behaviour: greedy counters equal
    # side by side (--perf-duet auto on 2 cores): one core per arm, swapped every round
    if rec["ab"]["mode"] == "duet":
        cores = [(c["cpu"], b["cpu"]) for c, b in zip(rec["rounds"], rec["ab"]["base_rounds"])]
        assert all(c != b for c, b in cores) and cores[0] == cores[1][::-1], cores
    assert (tiny[1] / "reports" / "ab.png").stat().st_size > 0

    slowed, rec = ab(tiny, "--perf-plant-slowdown", "3", "--perf-max-repeats", "15")
    assert slowed.returncode == 1, slowed.stdout[-3000:]
    assert rec["verdict"] == "regression"
    assert len(rec["rounds"]) < 15  # a regression ends the gate before the cap (settled)
    assert f"perf regression in {CID}: candidate working tree" in slowed.stdout
    assert "against base HEAD" in slowed.stdout
    # the gate stops at the first metric that regressed: plain or assisted, whichever settles first
    assert re.search(r"(plain|assisted)_tokens_per_sec: REGRESSION", slowed.stdout), slowed.stdout[-3000:]
    assert not workers_left()


@pytest.mark.parametrize("rev, message", [
    ("no-such-rev", "--perf-against no-such-rev: no such revision"),
])
def test_a_bad_revision_is_a_usage_error(tiny, rev, message):
    matrix, root = tiny
    r = subprocess.run([sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "--perf-matrix",
                        str(matrix), "--perf-against", rev], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})
    assert r.returncode == 4 and message in r.stderr and "Traceback" not in r.stderr
