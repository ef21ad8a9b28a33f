"""The noisy neighbour (benchmarks/noisy_host.py): options out of range are one line naming the
option; its load runs while its command does, is named to the command in HARNESS_NOISY_HOST, and
never outlives the run (command ended, SIGTERM, Ctrl-C, or the neighbour killed outright); the
command is stopped once, so its own clean-up runs to the end; the A/B gate's load guard counts the
named load as the gate's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.childenv import python_path
from harness.perf.ab.loadguard import NOISE_ENV, LoadGuard, noise_pids, process_cpu_s
from harness.core.errors import HarnessError
from waiting import wait_for

pytestmark = pytest.mark.alone  # load on every core, and the load guard's count of whose CPU time it was

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "noisy_host.py"
QUICK = ["--duty", "0.5", "--burst-ms", "20", "--memory-mb", "4"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize("args, message", [
    (["--duty", "0"], "--duty: 0.0: give a busy share above 0 and at most 1"),
    (["--duty", "1.5"], "--duty: 1.5: give a busy share above 0 and at most 1"),
    (["--burst-ms", "0.5"], "--burst-ms: 0.5: give a burst length between 1 and 60000 ms"),
    (["--memory-mb", "-1"], "--memory-mb: -1: give 0 to 4096 MiB"),
    (["--seconds", "0"], "--seconds: 0.0: give a duration above 0"),
    (["--cores", "0,999"], "--cores: '0,999': this process may use cores"),
])
def test_options_out_of_range_are_one_line_naming_the_option(args, message):
    r = subprocess.run([sys.executable, str(SCRIPT), *args, "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_command_runs_under_load_named_in_its_environment_and_the_load_ends_with_it():
    probe = ("import os, time; pids = [int(p) for p in os.environ['" + NOISE_ENV + "'].split(',')]; time.sleep(1.5); "
             "from harness.perf.ab.loadguard import process_cpu_s; "
             "print(','.join(map(str, pids)), sum(process_cpu_s(p) for p in pids))")
    r = subprocess.run([sys.executable, str(SCRIPT), *QUICK, "--", sys.executable, "-c", probe],
                       capture_output=True, text=True, timeout=120, cwd=SCRIPT.parents[1],
                       env={**os.environ, "PYTHONPATH": python_path(SCRIPT.parents[1])})
    assert r.returncode == 0, r.stderr
    pids, used = r.stdout.split()
    pids = [int(p) for p in pids.split(",")]
    assert len(pids) == len(os.sched_getaffinity(0)) and float(used) > 0  # one busy load process per core
    assert not any(alive(p) for p in pids)
    # the command's exit status is the neighbour's
    failed = subprocess.run([sys.executable, str(SCRIPT), *QUICK, "--", sys.executable, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 3


def test_a_neighbour_stopped_early_stops_its_command_too():
    neighbour = subprocess.Popen([sys.executable, str(SCRIPT), *QUICK, "--", sys.executable, "-c",
                                  "import time; time.sleep(120)"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cores = len(os.sched_getaffinity(0))
        assert wait_for(lambda: len(children(neighbour.pid)) == cores + 1)
        spawned = children(neighbour.pid)
        neighbour.send_signal(signal.SIGTERM)
        assert neighbour.wait(timeout=60) == 130
        assert wait_for(lambda: not any(alive(p) for p in spawned)), spawned
    finally:
        if neighbour.poll() is None:
            neighbour.kill()
            neighbour.wait()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_the_load_never_outlives_the_neighbour(how):
    neighbour = subprocess.Popen([sys.executable, str(SCRIPT), *QUICK, "--seconds", "120"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(children(neighbour.pid)) == len(os.sched_getaffinity(0)))
        load = children(neighbour.pid)
        neighbour.send_signal(getattr(signal, how))
        neighbour.wait(timeout=30)
        assert wait_for(lambda: not any(alive(p) for p in load)), f"left after {how}: {load}"
    finally:
        if neighbour.poll() is None:
            neighbour.kill()
            neighbour.wait()


def test_the_load_guard_counts_a_named_neighbour_as_the_gates_own():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
    try:
        time.sleep(0.3)
        plain, named = LoadGuard(), LoadGuard(noise=(spinner.pid,))
        before = plain.snapshot([]), named.snapshot([])
        time.sleep(1.0)
        after = plain.snapshot([]), named.snapshot([])
        # over the same second: the spinner took about one core of this machine's, which the named
        # guard leaves out of what others used (whatever else ran beside this test)
        share = plain.foreign(before[0], after[0]) - named.foreign(before[1], after[1])
        assert share > 0.5 / (os.cpu_count() or 1), share
        assert process_cpu_s(spinner.pid) > 0
    finally:
        spinner.kill()
        spinner.wait()
    assert noise_pids({NOISE_ENV: "12, 34"}) == (12, 34) and noise_pids({}) == ()
    with pytest.raises(HarnessError, match=f"{NOISE_ENV}='12,x': give the noisy neighbour's process ids"):
        noise_pids({NOISE_ENV: "12,x"})


# a command with a clean-up, as harness/core/termination.py makes one: the first SIGTERM starts it,
# a second kills outright (what a clean-up cut short looks like: no "cleaned" line)
CLEANS_UP = """
import os, signal, sys, time
def stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(1.0)
    open(sys.argv[1], "a").write("cleaned\\n")
    raise SystemExit(143)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
open(sys.argv[1], "a").write("started\\n")
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGTERM to the neighbour's process group", "SIGKILL to the neighbour alone"])
def test_the_command_is_stopped_once_and_its_clean_up_runs_to_the_end(tmp_path, how):
    """A cancelled CI job signals the whole process group; the command must not also get the
    neighbour's own SIGTERM on top, which would cut its clean-up (closing A/B workers) short. A
    neighbour killed outright still stops its command, which cleans up."""
    marks = tmp_path / "marks"
    neighbour = subprocess.Popen([sys.executable, str(SCRIPT), *QUICK, "--", sys.executable, "-c", CLEANS_UP, str(marks)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: marks.exists() and "started" in marks.read_text())
        if how.startswith("SIGTERM"):
            os.killpg(neighbour.pid, signal.SIGTERM)
        else:
            neighbour.kill()
        neighbour.wait(timeout=60)
        assert wait_for(lambda: "cleaned" in marks.read_text(), seconds=30), f"{how}: {marks.read_text()!r}"
        assert marks.read_text().split() == ["started", "cleaned"]
    finally:
        if neighbour.poll() is None:
            neighbour.kill()
            neighbour.wait()
        command = tmp_path / "marks.pid"
        if command.exists() and alive(pid := int(command.read_text())):  # a failed run: leave no process
            os.kill(pid, signal.SIGKILL)
