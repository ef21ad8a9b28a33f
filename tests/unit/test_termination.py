"""SIGTERM (a cancelled CI job, a `kill`) ends a run the way Ctrl-C does, with its clean-up: the CLI
stops a sandboxed run and removes its folder at once, and a pytest session (the plugin installs the
handler) closes an A/B worker that is busy with a request and removes its log. Without the handler
both die at once and leave their folders and logs to the next run's sweep, which these tests catch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from harness.core.childenv import python_path
from harness.core import termination
from harness.sandbox import cases as sandbox_cases
from harness.sandbox import execute as sandbox
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def _run_folders(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{sandbox.RUN_PREFIX}{pid}-*"))


def test_sigterm_of_the_cli_kills_the_sandboxed_run_and_removes_its_folder():
    cli = subprocess.Popen([sys.executable, "-m", "harness", "sandbox", "selftest", "--allow-code-execution",
                            "--skip-canonical"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _run_folders(cli.pid) and sandbox_cases._leftovers(), 60), "no sandboxed run started"
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == termination.EXIT_STATUS, err
    assert err.strip().splitlines()[-1] == "terminated", err  # one line, no traceback
    left = sandbox_cases._leftovers()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "a sandboxed process outlived the terminated CLI"
    assert not _run_folders(cli.pid), "the terminated CLI left its run folder for the next sweep"


def test_sigterm_of_pytest_closes_a_busy_worker_and_removes_its_log(tmp_path):
    tree = tmp_path / "tree"
    (tree / "harness").mkdir(parents=True)
    # a worker that answers hello and then spends two minutes on its next request (a model load)
    (tree / "slowworker.py").write_text(textwrap.dedent("""\
        import json, os, sys, time
        sys.stdin.readline()
        print(json.dumps({'ok': True, 'protocol': PROTOCOL, 'harness': os.path.join(os.getcwd(), 'harness')}), flush=True)
        sys.stdin.readline()
        time.sleep(120)
        """).replace("PROTOCOL", "__import__('harness.perf.ab.worker', fromlist=['x']).PROTOCOL"))
    state = tmp_path / "state"
    (tmp_path / "test_busy.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        from harness.perf.ab import revision
        from harness.perf.ab.arms import Arm

        def test_busy():
            arm = Arm("base", revision.Tree(Path({str(tree)!r}), "0" * 40, "slow", worker="slowworker"))
            try:
                arm.start()
                Path({str(state)!r}).write_text(f"{{arm.process.pid}} {{arm.log_path}}")
                arm.request({{"op": "load"}}, timeout_s=300)
            finally:
                arm.close(ask=False)
                arm.discard_log()
        """))
    env = {**os.environ, "PYTHONPATH": python_path(REPO)}
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: state.exists() and state.read_text(), 60), "the worker never started"
        worker, log_path = state.read_text().split()
        start = time.monotonic()
        session.send_signal(signal.SIGTERM)
        out, _ = session.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 2, out  # pytest's "interrupted"
    assert "Terminated: terminated by SIGTERM" in out, out
    assert took < 30, f"the session took {took:.0f} s to end"
    assert wait_for(lambda: not Path(f"/proc/{worker}").exists(), 10), "the busy worker outlived the session"
    assert not Path(log_path).exists(), "the worker's log was left for the next sweep"


@contextlib.contextmanager
def interrupted_child(clean_s: float) -> Iterator[tuple[subprocess.Popen, str]]:
    """A child under `sigterm_as_interrupt` whose clean-up prints "cleaning", takes `clean_s` and
    prints "cleaned", sent one SIGTERM once it sleeps: yields it with the first line it printed.
    It is killed on the way out if it still runs."""
    script = ("import time; from harness.core import termination\n"
              "with termination.sigterm_as_interrupt():\n"
              "    try:\n"
              "        time.sleep(60)\n"
              "    finally:\n"
              "        print('cleaning', flush=True)\n"
              f"        time.sleep({clean_s})\n"
              "        print('cleaned', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        yield proc, proc.stdout.readline()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_sigterm_kills_outright_and_a_handler_of_the_caller_is_kept():
    with interrupted_child(60) as (proc, first):
        assert first.strip() == "cleaning"
        time.sleep(termination.DUPLICATE_S + 0.5)  # sooner is the first stop delivered twice (the test below)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    # where the caller already handles SIGTERM, its handler stays in charge
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with termination.sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_same_stop_delivered_twice_lets_the_clean_up_run_to_the_end():
    """A cancelled `make` job: SIGTERM reaches the whole process group, and make passes it on to its
    job too, so the job gets two at once. The second must not cut its clean-up short."""
    with interrupted_child(1.0) as (proc, first):
        proc.send_signal(signal.SIGTERM)  # the forwarded copy, while the clean-up runs
        out, _ = proc.communicate(timeout=30)
    assert (first + out).split() == ["cleaning", "cleaned"], first + out
    assert proc.returncode != -signal.SIGTERM, "the second delivery killed the process during its clean-up"
