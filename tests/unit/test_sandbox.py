"""The sandbox against hostile completions, on every containment backend that works here, and the
HumanEval canonical solutions (all pass) against deliberately wrong ones (all fail)."""

from __future__ import annotations

import pytest

from harness.accuracy import humaneval
from harness.sandbox import execute as sandbox
from harness.sandbox import cases as sandbox_cases

BACKENDS = [b for b in sandbox.BACKENDS if sandbox._available(b)[0]]


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sandbox_cases.CASES, ids=lambda c: c.name)
def test_hostile_completion_is_contained(case, backend):
    if case.kernel_only and backend != "bwrap":
        pytest.skip("the kernel layer alone is complete only under bwrap")
    outcome = sandbox_cases.run_case(case, backend)
    assert outcome.status in case.expect, outcome.result
    assert outcome.files_intact, "a file outside the working directory changed"
    assert not outcome.leftover_processes, f"processes left behind: {outcome.leftover_processes}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_forged_token_from_outside_the_run_is_not_a_pass(backend):
    """The pass token is per run: the token of one run does not pass another."""
    r = sandbox.check_program(sandbox_cases.WRONG + "import os, sys\nos.write(int(sys.argv[-1]), b'PASS ' + b'a' * 64 "
                              "+ b'\\n')\nos._exit(0)\n", sandbox_cases.TEST, "f", backend=backend, allow=True)
    assert r.status == sandbox.FAILED and "forged" in r.result


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


@pytest.mark.skipif("bwrap" not in BACKENDS, reason="bwrap does not work here")
def test_bwrap_runs_an_interpreter_that_lives_under_tmp(tmp_path, monkeypatch):
    """A venv in a checkout under /tmp (CI clones often are) was hidden by bwrap's private /tmp, and
    the harness fell back to the weaker unshare backend."""
    if "/tmp" not in {str(p) for p in tmp_path.resolve().parents}:
        pytest.skip(f"pytest's tmp_path {tmp_path} is not under /tmp")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sandbox.sys.executable)
    monkeypatch.setattr(sandbox.sys, "executable", str(venv_python))
    result = sandbox.check_program(sandbox_cases.GOOD, sandbox_cases.TEST, "f", backend="bwrap", allow=True)
    assert result.passed, result
