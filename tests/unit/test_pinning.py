"""make test's parallel stage (tests/pinning.py): under `pytest -n 2` each worker runs on its own core
with one torch thread, and a child process a test starts stays on that core. Checked in a child pytest
of two workers whose probe tests write down where they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.childenv import python_path
from harness.machine import affinity
from pinning import worker_cores  # tests/ is on the path: tests/conftest.py

TESTS = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, subprocess, sys, pytest, torch

@pytest.mark.parametrize("n", range(4))
def test_where(n):
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True).stdout
    out = os.path.join(os.environ["PROBE_OUT"], os.environ.get("PYTEST_XDIST_WORKER", "main") + f"-{n}.json")
    with open(out, "w") as f:
        json.dump({"cores": sorted(os.sched_getaffinity(0)), "child": json.loads(child),
                   "threads": torch.get_num_threads()}, f)
"""


def test_the_cores_are_shared_out_among_the_workers():
    assert worker_cores("gw0", 2, [0, 1]) == [0] and worker_cores("gw1", 2, [0, 1]) == [1]
    assert worker_cores("gw1", 2, [0, 1, 2, 3, 4]) == [1, 3]
    assert worker_cores("gw1", 2, [5]) is None  # more workers than cores: the OS shares them
    assert worker_cores("master", 2, [0, 1]) is None


@pytest.mark.alone  # both cores, which a parallel worker pinned to one does not have
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="one core: two workers share it, nothing to pin")
def test_each_worker_and_its_children_run_on_their_own_core(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PROBE_OUT": str(out), "PYTHONPATH": python_path(TESTS)}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run in a worker
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pinning", "-n", "2",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    seen = {p.name.split("-")[0]: json.loads(p.read_text()) for p in out.glob("*.json")}
    cores = set(affinity.allowed_cores())
    assert set(seen) == {"gw0", "gw1"}, seen
    for where in seen.values():
        assert where["child"] == where["cores"] and where["threads"] == len(where["cores"]), seen
    first, second = (set(seen[w]["cores"]) for w in ("gw0", "gw1"))
    assert first and second and not first & second and first | second == cores, seen
