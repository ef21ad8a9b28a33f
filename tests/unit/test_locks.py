"""Locks across processes (harness/core/locks.py), and paths that are not regular files."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.core import jsonio, locks
from harness.perf.stored import baselines

HOLD = ("import sys, time; from harness.core import locks\n"
        "with locks.held(sys.argv[1], what='test'):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n")


def test_a_second_process_waits_names_the_holder_and_then_runs(tmp_path):
    path = tmp_path / "gate.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    heard = []
    start = time.monotonic()
    with locks.held(path, what="A/B gate", on_wait=heard.append):
        waited = time.monotonic() - start
        assert path.read_text().strip() == str(os.getpid())  # the holder's id, for the next one to name
    holder.wait()
    assert heard == [f"A/B gate: waiting for process {holder.pid}, which holds {path}"]
    assert waited > 0.5  # it did wait for the first to finish


# a holder caught between taking the lock and writing its id (what CI once saw: "waiting for process unknown")
SLOW_HOLDER = ("import fcntl, os, sys, time\n"
               "fd = os.open(sys.argv[1], os.O_RDWR)\n"
               "fcntl.flock(fd, fcntl.LOCK_EX)\n"
               "print('locked', flush=True); time.sleep(0.3)\n"
               "os.pwrite(fd, f'{os.getpid():<20}\\n'.encode(), 0); time.sleep(1.0)\n")


def test_the_waiter_names_the_live_holder_even_before_it_has_written_its_id(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "gate.lock"
    path.write_text(f"{dead.pid}\n")  # the previous holder's id, still in the file
    holder = subprocess.Popen([sys.executable, "-c", SLOW_HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    heard = []
    with locks.held(path, what="A/B gate", on_wait=heard.append):
        pass
    holder.wait()
    assert heard == [f"A/B gate: waiting for process {holder.pid}, which holds {path}"]


def test_a_lock_of_a_killed_process_is_free(tmp_path):
    path = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "60"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    heard = []
    with locks.held(path, what="test", on_wait=heard.append):
        pass
    assert heard == []


def test_a_fifo_at_a_baseline_path_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "cpu-x.json"
    os.mkfifo(fifo)
    with pytest.raises(baselines.BaselineError, match="not a regular file"):
        baselines.load(fifo)
    folder = tmp_path / "results.json"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="results.json: a folder; move it away"):
        jsonio.atomic_write_text(folder, "{}")


def test_sweep_removes_a_dead_owner_s_leftovers_only_under_its_exact_prefix(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f".tmp-qwen@{dead.pid}-abc"             # a killed fetch of 'qwen'
    other_model = tmp_path / f".tmp-qwen-coder@{dead.pid}-def"  # another model's: not this sweep's
    live = tmp_path / f".tmp-qwen@{os.getpid()}-ghi"             # a fetch still running
    for path in (mine, other_model, live):
        path.mkdir()
    assert locks.sweep(tmp_path, ".tmp-qwen@") == [mine]
    assert other_model.exists() and live.exists()


def test_a_lock_is_swept_once_what_it_guards_is_gone_and_nobody_holds_it(tmp_path):
    """A lock per baselines folder or repository (a test's temporary folder, say) does not outlive
    that folder; a named lock (a model's fetch) and a lock whose folder still exists are kept."""
    folder = tmp_path / "locks"
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir(), gone.mkdir()
    for name, guards in (("kept", kept), ("gone", gone), ("fetch-of-a-model", None)):
        with locks.held(folder / f"{name}.lock", what="test", guards=guards):
            pass
    assert (folder / "gone.lock").read_text().split("\n")[1] == str(gone.resolve())
    gone.rmdir()
    with locks.held(folder / "another.lock", what="test"):  # taking any lock there sweeps
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["another.lock", "fetch-of-a-model.lock", "kept.lock"]


def test_a_held_lock_is_never_swept_even_when_its_folder_is_gone(tmp_path):
    folder, guarded = tmp_path / "locks", tmp_path / "repository"
    guarded.mkdir()
    with locks.held(folder / "gate.lock", what="A/B gate", guards=guarded):
        guarded.rmdir()
        assert locks.sweep_orphans(folder) == []  # its holder is still at work
        assert (folder / "gate.lock").exists()
    assert locks.sweep_orphans(folder) == [folder / "gate.lock"]
