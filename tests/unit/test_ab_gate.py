"""The A/B gate end to end through pytest (a child run) on tiny local models: the working tree
against HEAD live (plumbing; no worker outlives the run), and its decisions on recorded rounds
replayed (--perf-replay; deterministic, whatever the host's speed): the recording's own verdict
again, a slowdown planted into the recorded candidate caught; bad revisions and recordings are
one-line usage errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.core import locks
from harness.core.childenv import python_path
from harness.perf.ab.arms import LOG_PREFIX
from tiny_models import write_local_matrix
from waiting import wait_for

# live A/B gates: their load guard would redo the rounds a parallel worker disturbed, and side-by-side
# arms take both cores
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / "tests" / "perf" / "test_perf_gate.py"
CID = "tiny+draft:fp32+fp32:cpu:greedy:k4"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    yield write_local_matrix(root), root
    for tree in (root / "cache" / "worktrees").glob("*/*"):  # the base worktrees the runs made
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def ab(tiny, *args: str, tolerance: str = "0.5", against: str | None = "HEAD") -> tuple[subprocess.CompletedProcess, dict]:
    matrix, root = tiny
    revision = ["--perf-against", against] if against else []
    cmd = [sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "-k", "tiny+draft",
           "--perf-matrix", str(matrix), "--perf-report-dir", str(root / "reports"), *revision,
           "--perf-tolerance", tolerance, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900,
                       env={**os.environ, "PYTHONPATH": python_path(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})
    report = root / "reports" / "results.json"
    results = json.loads(report.read_text())["results"] if report.exists() else []
    return r, next((x for x in results if x["combination"] == CID), {})


def workers_left() -> list[str]:
    """Workers (and stand-ins) of this module's gates (their cache is a tmp folder of this test run; a gate-power run
    beside the tests has workers of its own)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    left = []
    for line in ps.splitlines():
        pid, _, args = line.strip().partition(" ")
        if re.search(r"harness\.perf\.(ab\.)?(worker|standin)", args):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(b"HARNESS_CACHE_DIR=") and b"pytest-" in e for e in env):
                left.append(args)
    return left


def planted(results: Path, out: Path, fraction: float, metrics: tuple[str, ...], spread: float = 0.01) -> Path:
    """A copy of a recording made independent of the noise it was measured in, then slowed: every
    round of both arms at the base arm's median of each metric, `spread` above and below in turn
    (the arms in opposite phase, so each round's ratio moves by about 2 x spread), and the candidate's
    rounds `fraction` slower on `metrics`. Only the rounds' numbers change; their shape and greedy
    counters stay the live run's."""
    doc = json.loads(results.read_text())
    for entry in doc["results"]:
        base_rounds = entry["ab"]["base_rounds"]
        level = {m: statistics.median(r[m] for r in base_rounds) for m in ("plain_tokens_per_sec",
                                                                           "assisted_tokens_per_sec")}
        for arm, phase in ((base_rounds, 1), (entry["rounds"], -1)):
            for i, r in enumerate(arm):
                r.update({m: v * (1 + phase * spread * (-1) ** i) for m, v in level.items()})
                r["speedup"] = r["assisted_tokens_per_sec"] / r["plain_tokens_per_sec"]
        for r in entry["rounds"]:
            for m in metrics:
                r[m] /= 1 + fraction
            r["speedup"] = r["assisted_tokens_per_sec"] / r["plain_tokens_per_sec"]
    out.write_text(json.dumps(doc))
    return out


def live_recording(tiny) -> Path:
    """A live gate's recording of this module, for the tests that only need its shape and counters:
    the end-to-end test's, or one of 8 rounds made here where that test did not run first."""
    recording = tiny[1] / "recorded.json"
    if not recording.exists():
        ab(tiny, "--perf-max-repeats", "8", "--perf-repeats", "8")
        shutil.copy(tiny[1] / "reports" / "results.json", recording)
    return recording


def test_a_live_gate_runs_end_to_end_and_its_replay_decides_the_same(tiny, tmp_path):
    """The live gate on unchanged code: plumbing, whatever this host's noise decides (a tiny model's
    round is milliseconds; its decisions on a busy host are not this test's business). Its recording
    replayed at its own settings must give its own decisions, exactly."""
    # a first look at 8 rounds: the replay tests plant slowdowns into this recording (live_recording),
    # and 3 rounds (a first look that decides) leave a t interval too wide to call even 50%
    live, rec = ab(tiny, "--perf-repeats", "8", "--perf-max-repeats", "12")
    assert rec, live.stdout[-3000:]
    assert rec["verdict"] in ("pass", "undecided", "regression", "improvement"), rec["verdict"]
    assert live.returncode == (1 if rec["verdict"] == "regression" else 0), live.stdout[-3000:]
    assert rec["gate"] == "ab" and rec["ab"]["base"].startswith("HEAD ") and len(rec["rounds"]) >= 3
    assert len(rec["ab"]["base_rounds"]) == len(rec["rounds"]) <= 12
    # the tokens/s metrics and, both arms timing their passes on a CPU, every gated phase
    gated = {"target_step", "verify", "draft_step", "overhead"}
    gated |= {f"{p}_cpu" for p in gated}
    assert set(rec["ab"]["ratios"]) == {"speedup", "assisted_tokens_per_sec", "plain_tokens_per_sec", *gated}
    assert all(rec["decisions"][p]["cost"] for p in gated)
    assert rec["ab"]["behaviour_changes"] == []  # one code, one behaviour: greedy counters equal
    # side by side (--perf-duet auto on 2 cores): one core per arm, swapped every round, exchanged
    # every twentieth of a second within it (each round's `cpu` is the core it started on)
    assert rec["ab"]["swap_s"] == (0.05 if rec["ab"]["mode"] == "duet" else None)
    if rec["ab"]["mode"] == "duet":
        cores = [(c["cpu"], b["cpu"]) for c, b in zip(rec["rounds"], rec["ab"]["base_rounds"])]
        assert all(c != b for c, b in cores) and cores[0] == cores[1][::-1], cores
    # the stand-in took the first finished arm's core in every round side by side; none runs in turn
    assert rec["ab"]["stand_in_rounds"] == (len(rec["rounds"]) if rec["ab"]["mode"] == "duet" else None), rec["notes"]
    assert (tiny[1] / "reports" / "ab.png").stat().st_size > 0
    assert not workers_left()

    recording = tmp_path / "live.json"
    shutil.copy(tiny[1] / "reports" / "results.json", recording)
    shutil.copy(recording, tiny[1] / "recorded.json")  # the module's live recording (live_recording)
    again, replayed = ab(tiny, "--perf-repeats", "8", "--perf-max-repeats", "12", "--perf-replay", str(recording),
                         against=None)
    assert replayed["verdict"] == rec["verdict"] and replayed["decisions"] == rec["decisions"], again.stdout[-3000:]
    assert replayed["rounds"] == rec["rounds"] and replayed["ab"]["ratios"] == rec["ab"]["ratios"]
    assert replayed["ab"]["stand_in_rounds"] is None  # recorded arms: no process to stand in for
    assert f"replayed from {recording}" in again.stdout or rec["verdict"] == "pass"


def test_side_by_side_runs_started_together_and_a_base_that_cannot_says_so(tiny):
    """--perf-duet-sync on: every round of a live duet starts each of its runs in both arms together
    (its count is the recording's synced_rounds); a base whose worker predates that (the reference
    commit 3653dfa) runs each round through, and one note says so."""
    live, rec = ab(tiny, "--perf-duet", "on", "--perf-duet-sync", "on", "--perf-repeats", "4", "--perf-max-repeats", "4")
    assert rec, live.stdout[-3000:]
    assert rec["ab"]["mode"] == "duet" and len(rec["rounds"]) == 4
    assert rec["ab"]["synced_rounds"] == 4 and rec["ab"]["stand_in_rounds"] == 4, rec["notes"]
    assert rec["ab"]["behaviour_changes"] == []  # the same runs, in the same order, in both arms
    assert not any("--perf-duet-sync" in n for n in rec["notes"])
    assert not workers_left()

    old, rec = ab(tiny, "--perf-duet", "on", "--perf-duet-sync", "on", "--perf-repeats", "4", "--perf-max-repeats", "4",
                  against="3653dfa")
    assert rec, old.stdout[-3000:]
    assert rec["ab"]["synced_rounds"] == 0 and len(rec["rounds"]) == 4
    assert any(n.startswith("--perf-duet-sync on: the worker of base (3653dfa") and "each round together" in n
               for n in rec["notes"]), rec["notes"]
    assert not workers_left()


def test_two_gates_at_once_on_one_repository_both_complete_one_after_the_other(tiny, tmp_path):
    """Two gates measuring at once would share the cores and both be wrong: the second waits on the
    repository's A/B gate lock, says for which process, and then runs."""
    matrix, root = tiny

    def start(name: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "-k", "tiny+draft",
               "--perf-matrix", str(matrix), "--perf-report-dir", str(tmp_path / name), "--perf-against", "HEAD",
               "--perf-tolerance", "0.5", "--perf-max-repeats", "4", "--perf-undecided", "warn"]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": python_path(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})

    gates = [start("first"), start("second")]
    outputs = [g.communicate(timeout=900)[0] for g in gates]
    for g, name, out in zip(gates, ("first", "second"), outputs):  # each gate reached a verdict
        results = json.loads((tmp_path / name / "results.json").read_text())["results"]
        assert [r["verdict"] for r in results if r["combination"] == CID] and g.returncode in (0, 1), out[-3000:]
    waited = [(i, out) for i, out in enumerate(outputs) if "A/B gate: waiting for process" in out]
    assert len(waited) == 1, outputs
    i, out = waited[0]
    assert f"waiting for process {gates[1 - i].pid}," in out
    assert not workers_left()
    lock = root / "cache" / "locks" / f"ab-gate-{locks.path_key(REPO)}.lock"  # swept once the repository is gone
    assert lock.read_text().split("\n")[1] == str(REPO.resolve())


def test_sigterm_ends_a_live_gate_with_its_workers_and_their_logs(tiny, tmp_path):
    """A cancelled CI job (SIGTERM to pytest) ends the gate as Ctrl-C would: the workers are killed
    mid-round, not waited for, and their logs are removed, not left for the next gate's sweep."""
    matrix, root = tiny
    cmd = [sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "-k", "tiny+draft",
           "--perf-matrix", str(matrix), "--perf-report-dir", str(tmp_path), "--perf-against", "HEAD",
           "--perf-tolerance", "0.01", "--perf-repeats", "32", "--perf-max-repeats", "32"]
    gate = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": python_path(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})
    try:
        wait_for(lambda: len(workers_left()) >= 2 or gate.poll() is not None, 300)
        assert len(workers_left()) == 2, "the gate never started its two workers"
        time.sleep(2.0)  # into the rounds
        gate.send_signal(signal.SIGTERM)
        out, _ = gate.communicate(timeout=60)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()
    assert gate.returncode == 2 and "Terminated: terminated by SIGTERM" in out, out[-3000:]
    assert "-- stopped (interrupted): a combination still measuring is dropped" in out, out[-3000:]
    assert "measure a baseline" not in out  # the advice for a run that had nothing to gate
    assert wait_for(lambda: not workers_left(), 10), workers_left()
    assert not list(Path(tempfile.gettempdir()).glob(f"{LOG_PREFIX}{gate.pid}-*")), "worker logs were left behind"


def test_a_slowdown_in_the_recorded_candidate_is_a_regression(tiny, tmp_path):
    """The decision on recorded rounds (deterministic): the live recording, its rounds steadied, with
    the candidate's plain and assisted rounds 50% slower fails, naming the metric and both arms; the
    same rounds without the slowdown pass."""
    recording = live_recording(tiny)
    slowed = planted(recording, tmp_path / "slowed.json", 0.5, ("plain_tokens_per_sec", "assisted_tokens_per_sec"))
    r, rec = ab(tiny, "--perf-replay", str(slowed), against=None)
    assert r.returncode == 1 and rec["verdict"] == "regression", r.stdout[-3000:]
    assert f"perf regression in {CID}: candidate replayed working tree" in r.stdout
    assert "against base replayed HEAD" in r.stdout
    assert re.search(r"(plain|assisted)_tokens_per_sec: REGRESSION", r.stdout), r.stdout[-3000:]
    assert f"replayed from {slowed}" in r.stdout
    unchanged = planted(recording, tmp_path / "steady.json", 0.0, ())
    r, rec = ab(tiny, "--perf-replay", str(unchanged), against=None)
    assert r.returncode == 0 and rec["verdict"] == "pass", r.stdout[-3000:]


def test_a_recording_that_is_not_one_is_a_usage_error(tiny, tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text('{"schema_version": 1, "results": []}')
    r, _ = ab(tiny, "--perf-replay", str(bad), against=None)
    assert r.returncode == 4 and f"--perf-replay {bad}: schema_version" in r.stderr, r.stderr
    r, _ = ab(tiny, "--perf-replay", str(tmp_path / "none.json"), against=None)
    assert r.returncode == 4 and f"--perf-replay {tmp_path / 'none.json'}: no such file" in r.stderr, r.stderr
    r, _ = ab(tiny, "--perf-replay", str(bad))
    assert r.returncode == 4 and "--perf-replay: cannot be combined with --perf-against" in r.stderr, r.stderr
    # a deferred entry (no rounds) is skipped with the reason, and a run that gated nothing fails
    doc = json.loads(live_recording(tiny).read_text())
    for entry in doc["results"]:
        entry.update(gate="stored", verdict="deferred", rounds=[], ab=None, decisions={},
                     notes=["this host's probe is far from the baseline's"],
                     host={"ratios": {"memory_gbs": 3.0}, "threshold": 0.25, "comparable": False, "headline": "3x", "probe": {}})
    empty = tmp_path / "deferred.json"
    empty.write_text(json.dumps(doc))
    r, _ = ab(tiny, "--perf-replay", str(empty), against=None)
    assert r.returncode == 1 and "has no rounds of it (deferred, or not measured)" in r.stdout, r.stdout[-2000:]
    assert "nothing was gated" in r.stdout


@pytest.mark.parametrize("rev, message", [
    ("no-such-rev", "--perf-against no-such-rev: no such revision"),
])
def test_a_bad_revision_is_a_usage_error(tiny, rev, message):
    matrix, root = tiny
    r = subprocess.run([sys.executable, "-m", "pytest", str(GATE), "-p", "no:cacheprovider", "-q", "--perf-matrix",
                        str(matrix), "--perf-against", rev], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": python_path(REPO), "HARNESS_CACHE_DIR": str(root / "cache")})
    assert r.returncode == 4 and message in r.stderr and "Traceback" not in r.stderr


def test_a_gate_across_environments_names_both_and_the_package_they_differ_in(tiny, tmp_path):
    """--perf-base-env with a copy of transformers whose decoder layers spin 3x their time: the
    base arm runs the working tree in that overlay, the candidate here. Its results name both
    environments and the one package that differs, and its rounds show the base's passes slower
    (the plumbing; a verdict on a tiny model's milliseconds is not this test's business)."""
    from harness.perf import plant_package
    from harness.perf.ab import environment

    wheel = plant_package.transformers_wheel(tmp_path, 3.0)
    r, rec = ab(tiny, "--perf-base-env", str(wheel), "--perf-repeats", "4", "--perf-max-repeats", "4", against=None)
    assert rec, r.stdout[-3000:] + r.stderr[-3000:]
    envs = rec["ab"]["environments"]
    version = environment.current().packages["transformers"]
    assert envs["differences"] == {"transformers": [version + "+planted3.00", version]}
    assert envs["base"]["versions"]["transformers"] == version + "+planted3.00"
    assert envs["candidate"]["versions"]["transformers"] == version and envs["candidate"]["label"] == "this environment"
    assert rec["ab"]["base"].startswith("working tree") and f"in --perf-base-env {wheel}" in rec["ab"]["base"]
    assert f"--perf-base-env {wheel}: pip install" in r.stdout + r.stderr, r.stderr  # the build said what it did
    slower = [b["phases"]["target_step"]["median_ms"] / c["phases"]["target_step"]["median_ms"]
              for b, c in zip(rec["ab"]["base_rounds"], rec["rounds"])]
    assert statistics.median(slower) > 1.5, slower
    assert not workers_left()


@pytest.mark.parametrize("args, message", [
    (["--perf-base-python", "/nonexistent/bin/python"], "--perf-base-python /nonexistent/bin/python: no such interpreter"),
    (["--perf-base-python", sys.executable, "--perf-base-env", "x"], "--perf-base-python: cannot be combined with "
                                                                      "--perf-base-env"),
])
def test_a_base_environment_that_cannot_be_used_is_a_usage_error(tiny, args, message):
    r, _ = ab(tiny, *args, against=None)
    assert r.returncode == 4 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
