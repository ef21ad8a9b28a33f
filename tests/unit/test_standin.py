"""The stand-in (harness/perf/ab/standin.py): a real process that rests without using the CPU, works
on the core it is given while told to, stops within a chunk, and never outlives its gate; and the
controller learns which arm answered first without waiting on the other."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.machine import affinity
from harness.perf.ab.arms import Arm, first_to_answer
from harness.perf.ab.loadguard import process_cpu_s
from harness.perf.ab.standin import StandIn
from waiting import wait_for


def cpu_over(pid: int, seconds: float) -> float:
    start = process_cpu_s(pid)
    time.sleep(seconds)
    return process_cpu_s(pid) - start


@pytest.mark.alone  # it measures a process's CPU time, which a parallel test's load would take
def test_the_stand_in_works_only_while_covering_a_core_and_leaves_no_process():
    core = affinity.allowed_cores()[-1]
    stand_in = StandIn({"OMP_NUM_THREADS": "1"})
    assert stand_in.start()
    pid = stand_in.pid
    try:
        assert cpu_over(pid, 0.5) < 0.05  # resting: blocked on its commands
        assert stand_in.cover(os.getpid(), core) and os.sched_getaffinity(pid) == {core}
        assert wait_for(lambda: process_cpu_s(pid) > 0.2, 20)  # working
        stand_in.rest()
        time.sleep(0.2)  # stops within a chunk (milliseconds)
        assert cpu_over(pid, 0.5) < 0.05
    finally:
        stand_in.close()
    assert not Path(f"/proc/{pid}").exists() and stand_in.pid is None
    assert not stand_in.cover(os.getpid(), core)  # closed: covers nothing, says so


def test_a_stand_in_that_cannot_start_lets_the_gate_go_on_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr("harness.perf.ab.standin.START_TIMEOUT_S", 0.01)  # not ready in time
    stand_in = StandIn()
    assert not stand_in.start() and stand_in.pid is None
    assert "side by side without a stand-in (it did not get ready in time)" in caplog.text


def test_the_first_arm_to_answer_is_found_without_waiting_for_the_other():
    def arm(delay: float) -> Arm:
        a = Arm.__new__(Arm)
        a._buffer = b""
        a.process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({delay}); print('{{}}')"],
                                     stdout=subprocess.PIPE, text=True)
        return a

    slow, fast = arm(30), arm(0)
    try:
        t = time.monotonic()
        assert first_to_answer([slow, fast], 20) is fast and time.monotonic() - t < 15
        slow._buffer = b'{"ok": true}\n'  # an answer already read counts first
        assert first_to_answer([fast, slow], 0) is slow
        slow._buffer = b""
        assert first_to_answer([slow], 0.1) is None  # none within the timeout
    finally:
        for a in (slow, fast):
            a.process.kill()
            a.process.wait()
