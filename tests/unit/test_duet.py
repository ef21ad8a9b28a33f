"""Side-by-side arms (harness/perf/ab/duet.py): the mode is resolved once from --perf-duet and the
cores this process may use, the arms swap cores every round, and pinning reaches every thread of
a running worker from outside (so an older base revision runs side by side too)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.machine import affinity
from harness.perf.ab import duet


def test_on_with_one_core_is_a_one_line_error_naming_the_option():
    with pytest.raises(duet.DuetError, match=r"^--perf-duet on: this process may run on 1 core\(s\) \(\[3\]\).*or pass --perf-duet off$"):
        duet.plan("on", [3])


def test_runs_started_together_need_the_arms_side_by_side():
    with pytest.raises(duet.DuetError, match=r"^--perf-duet-sync on: the arms take turns under --perf-duet off, .*"
                                             r"pass --perf-duet on or auto$"):
        duet.plan("off", [0, 1], sync=True)
    assert duet.plan("on", [0, 1], sync=True).sync and "each run of a round together" in duet.plan("on", [0, 1], sync=True).reason
    assert not duet.plan("on", [0, 1]).sync
    # where the arms take turns anyway, the note says there is nothing to start together
    one_core = duet.plan("auto", [0], sync=True)
    assert not one_core.duet and not one_core.sync and "has no arms side by side" in one_core.reason
    gpu = duet.for_device(duet.plan("auto", [0, 1], sync=True), "cuda", "tiny:cuda")
    assert not gpu.duet and "has no arms side by side" in gpu.reason


def test_auto_falls_back_to_turns_and_says_so():
    p = duet.plan("auto", [5])
    assert p.mode == duet.INTERLEAVED and not p.duet and "the arms take turns" in p.reason and p.env() == {}


def test_side_by_side_arms_swap_cores_every_round_with_one_thread_each():
    p = duet.plan("auto", [2, 7, 9])
    assert p.duet and p.cores == (2, 7) and "cores 2 and 7" in p.reason
    assert [(p.core(0, r), p.core(1, r)) for r in range(3)] == [(2, 7), (7, 2), (2, 7)]
    assert p.env()["OMP_NUM_THREADS"] == "1"
    assert duet.plan("off", [0, 1]).core(0, 0) is None


def test_within_a_round_the_arms_exchange_cores_every_twentieth_of_a_second_unless_told_otherwise():
    p = duet.plan("on", [0, 1])
    assert p.swap_s == duet.SWAP_S == 0.05 and p.reason.endswith("swapping every round, and every 0.05 s within a round")
    once = duet.plan("auto", [0, 1], swap_s=0)
    assert once.swap_s is None and once.reason.endswith("swapping every round (--perf-duet-swap 0)")
    assert duet.plan("off", [0, 1], swap_s=1.0).swap_s is None  # in turn: nothing to exchange
    for bad in (-1, 0.01, float("nan")):
        with pytest.raises(duet.DuetError, match=r"^--perf-duet-swap .*: give 0 \(swap cores between rounds only\) or "
                                                 r"a period of at least 0.05 seconds \(default 0.05\)$"):
            duet.plan("auto", [0, 1], swap_s=bad)



def test_a_gpu_combination_takes_turns_under_auto_and_says_why():
    run = duet.plan("auto", [0, 1])
    gpu = duet.for_device(run, "cuda", "tiny+draft:fp32+fp32:cuda:greedy:k4")
    assert gpu.mode == duet.INTERLEAVED and gpu.cores is None and gpu.env() == {}
    assert "cuda combinations take turns" in gpu.reason and "share" in gpu.reason
    assert duet.for_device(run, "cpu", "c") is run  # the CPU's combinations keep the run's plan
    off = duet.plan("off", [0, 1])
    assert duet.for_device(off, "cuda", "c") is off


def test_on_with_a_gpu_combination_is_a_one_line_error_naming_the_option_and_the_combination():
    with pytest.raises(duet.DuetError, match=r"^--perf-duet on: tiny:cuda runs on cuda, and side by side both arms "
                                             r"would share .*pass --perf-duet auto .*--perf-platform cpu\)$") as caught:
        duet.for_device(duet.plan("on", [0, 1]), "cuda", "tiny:cuda")
    assert "\n" not in str(caught.value)

def allowed(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of `pid`."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        line = next(l for l in (task / "status").read_text().splitlines() if l.startswith("Cpus_allowed_list"))
        out.add(line.split()[1])
    return out


@pytest.mark.alone  # both cores, which a parallel worker pinned to one does not have
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="needs 2 cores to move a process between")
def test_pinning_reaches_every_thread_of_a_running_process():
    code = ("import threading, time\n"
            "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        a, b = affinity.allowed_cores()[:2]
        duet.pin(child.pid, a)
        assert allowed(child.pid) == {str(a)} and len(list(Path(f"/proc/{child.pid}/task").iterdir())) == 4
        duet.pin(child.pid, b)  # the next round: the other core
        assert allowed(child.pid) == {str(b)}
    finally:
        child.kill()
        child.wait()
    with pytest.raises(duet.DuetError, match="--perf-duet: cannot list the threads of worker"):
        duet.pin(child.pid, a)


def test_the_arm_moved_first_at_an_exchange_alternates():
    """The arm moved first shares the other's core until the other is moved off: each arm is first
    in half the exchanges, and every exchange leaves the arms on different cores, swapped."""
    swapping = duet.Swapping((101, 202), (4, 5), 0.05)
    where, first = {101: 4, 202: 5}, []
    for n in range(1, 101):
        moves = swapping.moves(n)
        assert sorted(pid for pid, _ in moves) == [101, 202]
        (mover, core), (other, _) = moves
        assert core == where[other]  # lands where the other still is
        first.append(mover)
        where.update(moves)
        assert where == ({101: 5, 202: 4} if n % 2 else {101: 4, 202: 5})
    assert first.count(101) == first.count(202) == 50


def test_the_exchanging_thread_pins_the_arms_in_the_order_of_moves(monkeypatch):
    swapping = duet.Swapping((101, 202), (4, 5), 0)
    pinned = []

    def pin(pid, core):
        pinned.append((pid, core))
        if len(pinned) == 8:
            swapping._stop.set()

    monkeypatch.setattr(duet, "pin", pin)
    swapping._run()
    assert pinned == [move for n in range(1, 5) for move in swapping.moves(n)]


def busy_children(n: int) -> list[subprocess.Popen]:
    """`n` processes that spin until killed, each with one thread."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_a_substitute_takes_the_core_and_the_place_of_a_finished_arm(monkeypatch):
    """The stand-in (harness/perf/ab/standin.py) lands on the core the finished arm holds after the
    exchanges so far, and is moved instead of it from then on; the other arm is untouched."""
    pinned = []
    monkeypatch.setattr(duet, "pin", lambda pid, core: pinned.append((pid, core)))
    for swaps, core in ((0, 5), (1, 4), (2, 5), (3, 4)):
        swapping = duet.Swapping((101, 202), (4, 5), 0.05)
        swapping.swaps = swaps
        where = dict(move for n in range(1, swaps + 1) for move in swapping.moves(n)) or {101: 4, 202: 5}
        assert where[202] == core
        pinned.clear()
        swapping.substitute(202, 303)
        assert pinned == [(303, core)] and swapping.pids == (101, 303)
        assert {pid for pid, _ in swapping.moves(swaps + 1)} == {101, 303}
    first = duet.Swapping((101, 202), (4, 5), 0.05)
    first.substitute(101, 303)
    assert first.pids == (303, 202)
    with pytest.raises(ValueError):
        first.substitute(404, 505)  # not an arm of this round


@pytest.mark.alone  # both cores, which a parallel worker pinned to one does not have
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="needs 2 cores to move processes between")
def test_an_arm_given_its_place_back_never_shares_its_partners_core():
    """The stand-in gives a waiting arm its place back (--perf-duet-sync): where an exchange stopped
    half done (a process that ended), the count of exchanges no longer says which core is free, so
    the arm goes to the core its partner does not hold."""
    a, b = affinity.allowed_cores()[:2]
    partner, standin, arm = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3))
    try:
        duet.pin(partner.pid, a)
        swapping = duet.Swapping((partner.pid, standin.pid), (a, b), 0.05)
        swapping.swaps = 1  # one exchange counted, though the partner was never moved: the count says core a
        swapping.substitute(standin.pid, arm.pid)
        assert allowed(arm.pid) == {str(b)} and swapping.pids == (partner.pid, arm.pid)
    finally:
        for child in (partner, standin, arm):
            child.kill()
            child.wait()


@pytest.mark.alone  # both cores, which a parallel worker pinned to one does not have
@pytest.mark.skipif(len(affinity.allowed_cores()) < 2, reason="needs 2 cores to move processes between")
def test_within_a_round_the_arms_exchange_cores_and_stop_when_it_ends():
    a, b = affinity.allowed_cores()[:2]
    children = busy_children(2)
    try:
        duet.pin(children[0].pid, a)
        duet.pin(children[1].pid, b)
        seen = []
        with duet.Swapping((children[0].pid, children[1].pid), (a, b), 0.05) as swapping:
            for _ in range(40):
                time.sleep(0.011)
                seen.append((allowed(children[0].pid), allowed(children[1].pid)))
        # both ways round, and each arm only ever on one of the two cores at a time
        assert ({str(a)}, {str(b)}) in seen and ({str(b)}, {str(a)}) in seen, seen
        assert swapping.swaps >= 4 and not swapping._thread.is_alive()
        after = (allowed(children[0].pid), allowed(children[1].pid))
        time.sleep(0.15)  # ended: nobody moves them any more
        assert (allowed(children[0].pid), allowed(children[1].pid)) == after
        # a worker that ends mid-round stops the exchanging, not the controller
        children[1].kill()
        children[1].wait()
        with duet.Swapping((children[0].pid, children[1].pid), (a, b), 0.02) as swapping:
            time.sleep(0.1)
        assert not swapping._thread.is_alive() and swapping.swaps == 1
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_the_swap_study_splits_one_gates_rounds_by_setting_and_shows_the_kept_gate(capsys):
    """benchmarks/duet_swap.py: the even rounds swapped between rounds only, the odd ones also within."""
    from bench_scripts import script_module

    with script_module("ab_power"), script_module("duet_swap") as study:
        row = {"swap_s": 0.25, "ratios": {"plain_tokens_per_sec": [1.1, 1.0, 0.9, 1.0, 1.1, 1.0]}}
        table = study.spreads(row)
        assert list(table) == ["between rounds", "every 0.25 s"]
        assert table["every 0.25 s"]["plain_tokens_per_sec"] == (0.0, 0.0)
        assert table["between rounds"]["plain_tokens_per_sec"][0] > 0.08
        two_periods = study.spreads({**row, "swap_s": 0.05, "even_swap_s": 0.25})
        assert list(two_periods) == ["every 0.25 s", "every 0.05 s"]
        assert two_periods["every 0.05 s"]["plain_tokens_per_sec"] == (0.0, 0.0)
        even, odd = duet.plan("on", [0, 1], swap_s=0.25), duet.plan("on", [0, 1], swap_s=0.05)
        assert [plan.swap_s for plan in study.alternating(even, odd).plans] == [0.25, 0.05]
        assert [plan.swap_s for plan in study.alternating(duet.plan("on", [0, 1], swap_s=0), odd).plans] == [None, 0.05]
        # --even-base-first: the even rounds move the base (the first pid) first at every exchange
        gate = study.alternating(odd, odd, even_base_first=True)
        assert gate.swapping_classes == (study.BaseFirst, duet.Swapping)
        assert {study.BaseFirst((101, 202), (0, 1), 0.05).moves(n)[0][0] for n in range(1, 9)} == {101}
        assert list(study.spreads({**row, "swap_s": 0.05, "even_swap_s": 0.05, "even_base_first": True})) == [
            "every 0.05 s, base first", "every 0.05 s, alternating"]
        with pytest.raises(SystemExit):  # --level: a fraction below 1
            study.main(["--level", "1", "--out", "unused.jsonl"])
        kept = Path(study.__file__).parent / "data" / "duet_swap_avx2.jsonl"
        assert study.main(["--out", str(kept), "--show"]) == 0
    out = capsys.readouterr().out
    assert "32 A/A rounds" in out and "every 0.25 s" in out and "plain_tokens_per_sec" in out

def test_the_start_study_shows_each_trees_starts_and_their_median(capsys):
    """benchmarks/worker_start.py --show: the kept starts, per host condition and tree."""
    from bench_scripts import script_module

    with script_module("ab_power"), script_module("noise_sources"), script_module("worker_start") as study:
        with pytest.raises(SystemExit):  # --starts: at least 1
            study.main(["--starts", "0", "--out", "unused.jsonl"])
        kept = Path(study.__file__).parent / "data" / "worker_start_avx2.jsonl"
        assert study.main(["--out", str(kept), "--show"]) == 0
        rows = [{"combination": "c", "cpu_class": "avx2", "condition": "quiet", "tree": tree, "commit": commit,
                 "seconds": seconds} for tree, commit, seconds in
                [("HEAD", "a" * 40, 90.0), ("working tree", "a" * 40, 70.0), ("HEAD", "a" * 40, 80.0),
                 ("working tree", "a" * 40, 60.0), ("HEAD", "a" * 40, 100.0),
                 ("HEAD", "b" * 40, 50.0), ("working tree", "b" * 40, 40.0)]]
        study.show(rows)
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  HEAD") for line in out) and "seconds a worker pair took to start" in out[0]
    # one comparison per HEAD commit: a later study's starts do not join an earlier one's median
    assert out[-6].endswith("HEAD aaaaaaaaaaaa: seconds a worker pair took to start")
    assert out[-5].endswith("90.0 80.0 100.0; median 90.0") and out[-4].endswith("70.0 60.0; median 65.0")
    assert out[-3].endswith("HEAD bbbbbbbbbbbb: seconds a worker pair took to start")
    assert out[-2].endswith(" 50.0; median 50.0") and out[-1].endswith(" 40.0; median 40.0")


def test_the_start_study_shows_how_far_each_trees_first_round_stood_from_the_rest(capsys):
    """benchmarks/worker_start.py --rounds: the first round after a start against the rounds after it,
    per tree, over both arms of every start; a round without a phase (None) leaves that phase out."""
    from bench_scripts import script_module

    with script_module("ab_power"), script_module("noise_sources"), script_module("worker_start") as study:
        for rounds in ("-1", "1", "5"):  # one round has nothing to be compared with; a gate restarts after 4
            with pytest.raises(SystemExit):
                study.main(["--rounds", rounds, "--out", "unused.jsonl"])
            assert f"--rounds {rounds}: 0, or 2 to 4" in capsys.readouterr().err
        kept = Path(study.__file__).parent / "data" / "first_round_avx512-bf16.jsonl"
        assert study.main(["--rounds", "4", "--out", str(kept), "--show"]) == 0  # 4 accepted; the kept rows shown
        assert "first round against the rest: speedup" in capsys.readouterr().out
        first_slow = {"assisted_tokens_per_sec": [9.0, 10.0, 10.0], "draft_step": [22.0, 20.0, 20.0],
                      "verify": [None, 30.0, 30.0], "page_faults": [1261, 0, 3]}
        first_even = {"assisted_tokens_per_sec": [10.0, 10.0, 10.0], "draft_step": [20.0, 20.0, 20.0],
                      "verify": [30.0, 30.0, 30.0], "page_faults": [2, 0, 101]}
        rows = [{"combination": "c", "cpu_class": "avx2", "condition": "quiet", "tree": tree, "commit": "a" * 40,
                 "seconds": 60.0, "rounds": {"base": arm, "candidate": arm}} for tree, arm in
                [("HEAD", first_slow), ("working tree", first_even)]]
        study.show(rows)
    out = capsys.readouterr().out.splitlines()
    head, tree = out[2], out[5]
    assert "first round against the rest: assisted_tokens_per_sec -10.5% (sd 0.0%, 2 arms)" in head
    assert "draft_step +9.5% (sd 0.0%, 2 arms)" in head and "verify" not in head
    assert "assisted_tokens_per_sec +0.0%" in tree and "verify +0.0% (sd 0.0%, 2 arms)" in tree
    # each round's page faults: in how many arms the round touched over 100 pages anew, not a ratio
    assert "page_faults" not in head + tree
    assert out[3].endswith("page faults over 100 in a round: round 1: 2 of 2 arms (most 1261), "
                           "round 2: 0 of 2 arms (most 0), round 3: 0 of 2 arms (most 3)")
    assert out[6].endswith("round 1: 0 of 2 arms (most 2), round 2: 0 of 2 arms (most 0), round 3: 2 of 2 arms (most 101)")
