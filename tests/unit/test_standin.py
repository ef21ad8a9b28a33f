"""The stand-in (harness/perf/ab/standin.py): a real process that rests without using the CPU, works
on the core it is given while told to, stops within a chunk, and never outlives its gate; and the
controller learns which arm answered first without waiting on the other."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_scripts import script_module

from harness.machine import affinity
from harness.perf.ab import duet
from harness.perf.ab.arms import Arm, ArmError, first_to_answer
from harness.perf.ab.worker import SYNC
from harness.perf.ab.gate import ABGate
from harness.perf.ab.loadguard import process_cpu_s
from harness.perf.ab.standin import StandIn
from harness.perf.combinations import PerfSettings
from harness.workload import registry
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
        before = process_cpu_s(pid)
        assert stand_in.cover(os.getpid(), core) and os.sched_getaffinity(pid) == {core}
        assert wait_for(lambda: process_cpu_s(pid) > before + 0.2, 20)  # working
        stand_in.rest()  # returns once it has stopped, and stays for the next round
        assert stand_in.pid == pid
        assert cpu_over(pid, 0.5) < 0.05
    finally:
        stand_in.close()
    assert not Path(f"/proc/{pid}").exists() and stand_in.pid is None
    assert not stand_in.cover(os.getpid(), core)  # closed: covers nothing, says so


def test_a_stand_in_that_cannot_start_is_killed_at_once_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr("harness.perf.ab.standin.START_TIMEOUT_S", 0.01)  # not ready in time
    started = []
    real = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: started.append(real(*a, **kw)) or started[-1])
    stand_in = StandIn()
    t = time.monotonic()
    assert not stand_in.start() and stand_in.pid is None and not stand_in.cover(os.getpid(), 0)
    assert time.monotonic() - t < 5 and started[0].poll() is not None  # killed, not asked while it imports
    assert "side by side without a stand-in (it did not get ready in time)" in caplog.text


class FakeStandIn:
    """Records what the gate asks of its stand-in."""
    pid = None

    def __init__(self):
        self.calls = []

    def cover(self, pid, where):
        self.calls.append(("cover", pid, where))
        return True

    def release(self, pid, where):
        self.calls.append(("release", pid, where))

    def rest(self):
        self.calls.append(("rest",))


def answering(name: str, script: str) -> Arm:
    """An arm whose worker runs `script` (it reads the round's request from stdin)."""
    a = Arm.__new__(Arm)
    a.name, a._buffer, a.timeout_s, a.failed, a.log_path = name, b"", 30.0, False, Path(os.devnull)
    a.tree = SimpleNamespace(label=name, commit="0" * 12)
    a.environment = SimpleNamespace(python=sys.executable, label="here")
    a.process = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); " + script],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    return a


@pytest.mark.alone  # pins both cores
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="needs 2 cores for side-by-side arms")
@pytest.mark.parametrize("swap_s", [0.05, 0])
def test_the_gate_covers_the_first_arm_to_finish_and_rests_the_stand_in_whatever_happens(swap_s):
    cores = affinity.allowed_cores()[:2]
    answer = "print('{\"ok\": true}', flush=True)"
    gate = ABGate.__new__(ABGate)
    gate.plan, gate.stand_in = duet.plan("on", cores, swap_s=swap_s), FakeStandIn()
    gate.synced = None  # each round through (--perf-duet-sync off)
    gate.arms = {"base": answering("base", "time.sleep(1); " + answer), "candidate": answering("candidate", answer)}
    started = list(gate.arms.values())
    try:
        answers = gate._side_by_side(0)
        assert answers == {"base": ({"ok": True}, cores[0]), "candidate": ({"ok": True}, cores[1])}
        (what, pid, where), rest = gate.stand_in.calls
        assert (what, pid, rest) == ("cover", gate.arms["candidate"].process.pid, ("rest",)) and gate.covering
        assert isinstance(where, duet.Swapping) if swap_s else where == cores[1]  # the finished arm's core
        # a worker that dies mid-round: it is "first" (its pipe ends), the round fails, the stand-in rests
        gate.stand_in = FakeStandIn()
        gate.arms = {"base": answering("base", "time.sleep(0.5); " + answer), "candidate": answering("candidate", "")}
        started += gate.arms.values()
        with pytest.raises(ArmError, match="the worker died during round"):
            gate._side_by_side(1)
        assert gate.stand_in.calls[-1] == ("rest",)
    finally:
        for arm in started:
            arm.close(ask=False)


# a worker of a round with two runs (one prompt, plain and assisted) under --perf-duet-sync on: after its
# first run it says so and waits for go; its answer says how long it waited
IN_STEP = ("print('{\"ok\": true, \"between\": 1, \"of\": 2}', flush=True); t = time.monotonic(); "
           "assert sys.stdin.readline().strip() == '{\"op\": \"go\"}'; "
           "print('{\"ok\": true, \"waited\": %f}' % (time.monotonic() - t), flush=True)")


@pytest.mark.alone  # pins both cores
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="needs 2 cores for side-by-side arms")
def test_runs_started_together_wait_for_the_slower_arm_with_the_stand_in_on_the_waiting_core():
    """--perf-duet-sync on: the arm that finishes a run first waits until the other has too (the
    stand-in on its core meanwhile, then its place given back), and only then do both go on."""
    cores = affinity.allowed_cores()[:2]
    gate = ABGate.__new__(ABGate)
    gate.plan, gate.stand_in = duet.plan("on", cores, swap_s=0, sync=True), FakeStandIn()
    gate.synced, gate.covering, gate.in_step = 0, False, False
    gate.combo = SimpleNamespace(id="c")
    gate.arms = {"base": answering("base", "time.sleep(1.5); " + IN_STEP), "candidate": answering("candidate", IN_STEP)}
    for arm in gate.arms.values():
        arm.features = frozenset({SYNC})
    started = list(gate.arms.values())
    try:
        answers = gate._side_by_side(0)
        waited = {name: answer["waited"] for name, (answer, _) in answers.items()}
        assert waited["candidate"] > 1.0 > waited["base"], waited  # it waited for the base's first run
        candidate = gate.arms["candidate"].process.pid
        assert gate.stand_in.calls[:2] == [("cover", candidate, cores[1]), ("release", candidate, cores[1])]
        assert gate.in_step and gate.covering
        # a base whose round goes through without stopping (an older worker asked anyway): a broken step
        gate.stand_in = FakeStandIn()
        gate.arms = {"base": answering("base", "print('{\"ok\": true}', flush=True)"),
                     "candidate": answering("candidate", IN_STEP)}
        for arm in gate.arms.values():
            arm.features = frozenset({SYNC})
        started += gate.arms.values()
        with pytest.raises(ArmError, match=r"round 1: the arms' rounds differ in their runs"):
            gate._side_by_side(0)
        assert all(arm.failed for arm in gate.arms.values())  # their logs are kept: the message names them
    finally:
        for arm in started:
            arm.close(ask=False)


def counting_gate(covering: list[bool], disturbed: list[bool]) -> ABGate:
    """A gate whose rounds only say whether the stand-in covered them, and whose guard sees a
    disturbance where `disturbed` says (one entry per try)."""
    gate = ABGate.__new__(ABGate)
    gate.plan, gate.arms, gate.samples, gate.combo = SimpleNamespace(duet=True), {}, {}, SimpleNamespace(id="c")
    gate.stand_in, gate.redone, gate.covered, gate.notes = SimpleNamespace(pid=None), 0, 0, []
    tries, disturbances = iter(covering), iter(disturbed)
    gate.guard = SimpleNamespace(snapshot=lambda pids: None,
                                 disturbance=lambda before, after: "busy" if next(disturbances) else None)

    def side_by_side(index):
        gate.covering = next(tries)
        return {}

    gate._side_by_side = side_by_side
    return gate


def test_the_rounds_the_stand_in_covered_are_counted_once_each_and_a_shortfall_is_said():
    # round 0: covered but disturbed, so measured again, uncovered; round 1: covered at once
    gate = counting_gate(covering=[True, False, True], disturbed=[True, False, False])
    gate.round(0)
    assert (gate.redone, gate.covered) == (1, 0)  # the discarded try does not count
    gate.round(1)
    assert gate.covered == 1
    assert gate.stand_in_note(2) == ("the stand-in covered 1 of 2 rounds (see the log for why): in the others "
                                     "the arm that finished last ran its end alone")
    gate.covered = 2
    assert gate.stand_in_note(2) is None
    gate.covers = lambda index: index % 2 == 0  # a study covering every other round: 1 of 2 is all it asked
    gate.covered = 1
    assert gate.stand_in_note(2) is None


def test_a_stand_in_that_cannot_start_leaves_the_count_at_zero_and_says_so_once(monkeypatch):
    class Failing:
        def __init__(self, env):
            pass

        def start(self):
            return False

    monkeypatch.setattr("harness.perf.ab.gate.StandIn", Failing)
    gate = ABGate.__new__(ABGate)
    gate.plan = SimpleNamespace(duet=True, env=lambda: {}, sync=False)
    gate.arms = {name: SimpleNamespace(start=lambda: None, process=SimpleNamespace(pid=1))
                 for name in ("base", "candidate")}
    gate.covered, gate.notes = None, []
    gate._load_all = lambda: None
    gate.start()
    assert gate.covered == 0 and gate.stand_in is None
    assert [n for n in gate.notes if "could not start" in n] and gate.stand_in_note(8) is None
    gate.plan = SimpleNamespace(duet=False)  # arms in turn: no count at all
    gate.covered, gate.notes = None, []
    gate.start()
    assert gate.covered is None and gate.notes == []


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


def test_gate_power_gates_with_the_stand_in_never_join_a_file_of_gates_without_it(tmp_path, monkeypatch):
    """benchmarks/ab_power.py: side by side now always has the stand-in, so adding gates to a file kept
    before it would mix two setups under one row of the gate-power table: refused, naming the file,
    before any worktree or worker starts (on two cores whatever this test process is pinned to)."""
    monkeypatch.setattr(duet, "plan", functools.partial(duet.plan, cores=[0, 1]))
    with script_module("ab_power") as ab_power:
        matrix = registry.load_matrix()
        pair = "qwen-coder-1.5b+0.5b"
        combo = ab_power.combination(matrix, pair, PerfSettings.from_matrix(matrix))
        old = tmp_path / "ab_power_old.jsonl"
        row = {"combination": combo.id, "condition": "quiet", "mode": "duet", "swap_s": duet.SWAP_S,
               "cpu_class": matrix.cpu_class, "level": 0.0, "into": "target", "tolerance": 0.1, "rounds": 8}
        old.write_text(json.dumps(row) + "\n")
        with pytest.raises(SystemExit, match="ab_power_old.jsonl: holds gates side by side without the stand-in"):
            ab_power.main(["--pair", pair, "--duet", "on", "--levels", "0", "--gates", "1", "--out", str(old)])
        assert old.read_text() == json.dumps(row) + "\n"  # nothing written


def test_gate_power_counts_each_cpus_gates_for_it_alone(monkeypatch):
    """benchmarks/ab_power.py: one class covers several CPUs (an "AMD EPYC" VM may be a Zen 4 or a Zen 5),
    so in a file holding several, the gates a run counts on (and the A/A rounds it resamples) are those
    its own CPU recorded, never another's nor those kept before the CPU was recorded; the table gives
    each CPU rows of its own, and one command adds to the file on any of them."""
    monkeypatch.setattr(duet, "plan", functools.partial(duet.plan, cores=[0, 1]))
    with script_module("ab_power") as ab_power, script_module("gate_power_table") as table:
        plan = duet.plan("on")
        zen4 = {"model": "AMD EPYC", "generation": "family 25 model 17"}
        zen5 = {"model": "AMD EPYC", "generation": "family 26 model 2"}
        base = {"combination": "p+d:bf16:cpu:greedy:k16", "condition": "quiet", "mode": "duet", "swap_s": plan.swap_s,
                "cpu_class": "avx512-bf16", "level": 0.0, "into": "target", "tolerance": 0.1, "rounds": 8,
                "stand_in_rounds": 8}
        rows = [dict(base, cpu=zen5), dict(base, cpu=zen4), dict(base), dict(base, condition="noisy", cpu=zen4)]
        setup = ab_power.same_setup(rows, base["combination"], plan, "quiet", "avx512-bf16")
        assert setup == rows[:3], setup
        names = [ab_power.host_of(r) for r in rows[:3]]
        assert names == ["AMD EPYC, family 26 model 2", "AMD EPYC, family 25 model 17", None], names
        assert ab_power.on_host(setup, names[1]) == [rows[1]]
        assert ab_power.on_host(setup, names[0]) == [rows[0]]
        groups = table.grouped([("ab_power_x.jsonl", r) for r in rows[:3]], (8, 8, 32))
        assert sorted(g.cpu or "" for g in groups) == ["", *names[1::-1]]
        assert len({g.place for g in groups}) == 1  # one file and setup: one command adds to it on any CPU


def test_gate_power_reports_the_gates_of_the_cpu_it_is_asked_for(tmp_path, monkeypatch, capsys):
    """benchmarks/ab_power.py --gates 0 on a file holding two CPUs' gates and some kept before the CPU was
    recorded: it reports this host's CPU's alone, another's with --cpu NAME, the unrecorded ones with
    --cpu "not recorded"; asking for gates on a CPU not this host's is refused, naming --cpu."""
    monkeypatch.setattr(duet, "plan", functools.partial(duet.plan, cores=[0, 1]))
    with script_module("ab_power") as ab_power:
        matrix = registry.load_matrix()
        pair = "qwen-coder-1.5b+0.5b"
        combo = ab_power.combination(matrix, pair, PerfSettings.from_matrix(matrix))
        kept = ab_power.REPO / "benchmarks/data/ab_power_avx512-bf16_duet-swap0.05-standin_quiet_k16-fused-c0.6.jsonl"
        aa = [row for row in map(json.loads, kept.read_text().splitlines()) if row["level"] == 0 and row["into"] == "target"
              and row.get("tolerance") == 0.1]
        zen4 = next(r for r in aa if r["cpu"]["generation"] == "family 25 model 17")
        zen5 = [r for r in aa if r["cpu"]["generation"] == "family 26 model 2"][:2]
        unrecorded = {k: v for k, v in zen5[0].items() if k != "cpu"}
        out = tmp_path / "ab_power_mixed.jsonl"
        out.write_text("".join(json.dumps(dict(r, combination=combo.id, cpu_class=matrix.cpu_class)) + "\n"
                               for r in [zen4, *zen5, unrecorded]))
        monkeypatch.setattr(ab_power, "host_cpu", lambda: zen4["cpu"])
        args = ["--pair", pair, "--duet", "on", "--levels", "0", "--gates", "0", "--trials", "4", "--out", str(out)]
        for cpu, gates in ((None, 1), ("AMD EPYC, family 26 model 2", 2), ("not recorded", 1), ("AMD EPYC, family 9", 0)):
            ab_power.main(args + (["--cpu", cpu] if cpu else []))
            printed = capsys.readouterr().out
            assert f"A/A rounds of {gates} gates" in printed, (cpu, printed)
        with pytest.raises(SystemExit, match="--cpu not recorded: this host is AMD EPYC, family 25 model 17"):
            ab_power.main([*args[:7], "1", "--out", str(out), "--cpu", "not recorded"])
