"""The A/B gate's parts: the load guard's reading of /proc, base revisions (missing, too old,
reused, dirty) and the worker protocol against the working tree's own worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.perf.ab import loadguard, revision
from harness.perf.ab.environment import Environment
from harness.perf.ab.arms import Arm, ArmError
from harness.perf.ab.worker import PROTOCOL
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
PREDATES = "6040276"  # a commit of this repository older than the A/B gate


def test_parse_stat_reads_the_aggregate_line():
    text = "cpu  100 5 50 1000 10 1 2 30 0 0\ncpu0 50 2 25 500 5 0 1 15 0 0\n"
    t = loadguard.parse_stat(text)
    hz = loadguard.CLOCK_TICKS
    assert t.busy == pytest.approx(158 / hz) and t.steal == pytest.approx(30 / hz)
    assert t.total == pytest.approx(1198 / hz)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc here")
@pytest.mark.alone
def test_the_guard_sees_another_process_take_a_core():
    guard = loadguard.LoadGuard()
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.2)
        before = guard.snapshot([])
        time.sleep(1.0)
        why = guard.disturbance(before, guard.snapshot([]))
    finally:
        burner.wait()
    assert why is not None and "other processes used" in why
    # the same burn counted as the gate's own work is no disturbance
    own = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.2)
        before = guard.snapshot([own.pid])
        time.sleep(1.0)
        after = guard.snapshot([own.pid])
    finally:
        own.wait()
    assert after.own_cpu_s - before.own_cpu_s > 0.3  # the burner's CPU time is counted as the gate's own


def test_a_revision_that_does_not_exist_names_the_option():
    with pytest.raises(revision.RevisionError, match=r"--perf-against no-such-rev: no such revision .* sha, branch or tag"):
        revision.checkout(REPO, "no-such-rev")


def test_a_shallow_clone_says_to_fetch_its_history(tmp_path):
    """CI's default checkout has one commit: the reference commit is then missing for a reason the
    error must name, not "no such revision" alone."""
    def git(*args: str, cwd: Path) -> str:
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()
    origin = tmp_path / "origin"
    origin.mkdir()
    git("init", "-q", cwd=origin)
    for n in (1, 2):
        (origin / "f").write_text(str(n))
        git("add", "f", cwd=origin)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", str(n), cwd=origin)
    first = git("rev-parse", "HEAD~1", cwd=origin)
    git("clone", "-q", "--depth", "1", f"file://{origin}", str(tmp_path / "shallow"), cwd=tmp_path)
    with pytest.raises(revision.RevisionError, match=r"--perf-against [0-9a-f]+: no such revision .*shallow clone.*"
                                                     r"git fetch --unshallow.*docs/ci.md"):
        revision.resolve(tmp_path / "shallow", first)
    assert revision.resolve(origin, first) == first


def test_a_revision_older_than_the_gate_is_refused():
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREDATES}^{{commit}}"]).returncode != 0:
        pytest.skip(f"{PREDATES} is not in this clone's history")
    with pytest.raises(revision.RevisionError, match="has no A/B worker .* predates the A/B gate"):
        revision.checkout(REPO, PREDATES)


def test_head_checks_out_once_and_a_dirty_worktree_is_refused(tmp_path):
    tree = revision.checkout(REPO, "HEAD", root=tmp_path)
    try:
        assert (tree.path / (tree.worker.replace(".", "/") + ".py")).is_file() and len(tree.commit) == 40
        assert revision.checkout(REPO, "HEAD", root=tmp_path).path == tree.path  # reused
        (tree.path / "harness" / "__init__.py").write_text("# edited\n")
        with pytest.raises(revision.RevisionError, match="is not a clean checkout .*git worktree remove --force"):
            revision.checkout(REPO, "HEAD", root=tmp_path)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree.path)], check=True)


def small_repository(path: Path, commits: int = 1) -> Path:
    """A git repository whose commits have an A/B worker file (what checkout asks of a base)."""
    worker = path / revision.WORKER
    worker.parent.mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    for i in range(commits):
        worker.write_text(f"# worker {i}\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"c{i}"], check=True)
    return path


def test_worktrees_of_a_deleted_repository_or_unused_for_weeks_are_removed(tmp_path, monkeypatch):
    """Every clean CI clone checks out its base under the cache and is then deleted: the next
    checkout removes such worktrees, and those of a live repository unused for two weeks."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    live = small_repository(tmp_path / "live", commits=3)
    gone = small_repository(tmp_path / "clone")
    of_gone = revision.checkout(gone, "HEAD").path
    stale = revision.checkout(live, "HEAD~2").path
    recent = revision.checkout(live, "HEAD~1").path
    old = time.time() - 15 * 86400
    os.utime(stale, (old, old))
    shutil.rmtree(gone)
    used = revision.checkout(live, "HEAD").path
    assert not of_gone.exists() and not of_gone.parent.exists(), "the deleted clone's worktree and its folder"
    assert not stale.exists() and recent.exists() and used.exists()
    old_again = time.time() - 15 * 86400
    os.utime(recent, (old_again, old_again))
    assert revision.checkout(live, "HEAD~1").path == recent
    revision.checkout(live, "HEAD")
    assert recent.exists(), "a reuse is a use: the worktree is two weeks younger"
    listed = subprocess.run(["git", "-C", str(live), "worktree", "list"], capture_output=True, text=True).stdout
    assert str(stale) not in listed and str(recent) in listed


def test_a_locked_worktree_is_refused_with_what_to_do(tmp_path):
    tree = revision.checkout(REPO, "HEAD", root=tmp_path)
    try:
        gitdir = Path(subprocess.run(["git", "-C", str(tree.path), "rev-parse", "--absolute-git-dir"],
                                     capture_output=True, text=True, check=True).stdout.strip())
        (gitdir / "index.lock").write_text("")  # another git process at work there
        with pytest.raises(revision.RevisionError, match=r"is locked by a git lock file .*index\.lock"):
            revision.checkout(REPO, "HEAD", root=tmp_path)
        (gitdir / "index.lock").unlink()
        assert revision.checkout(REPO, "HEAD", root=tmp_path).path == tree.path
        # `git worktree lock`, then the folder removed by hand: git refuses to check out there again
        subprocess.run(["git", "-C", str(REPO), "worktree", "lock", str(tree.path)], check=True)
        subprocess.run(["rm", "-rf", str(tree.path)], check=True)
        with pytest.raises(revision.RevisionError, match="locked worktree .*git worktree unlock"):
            revision.checkout(REPO, "HEAD", root=tmp_path)
        subprocess.run(["git", "-C", str(REPO), "worktree", "unlock", str(tree.path)], check=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree.path)])
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"])


def test_a_worker_answers_in_its_own_tree_and_leaves_nothing_behind():
    arm = Arm("candidate", revision.working_tree(REPO), timeout_s=60)
    arm.start()
    pid = arm.process.pid
    with pytest.raises(ArmError, match="candidate .*round failed: RuntimeError: round before load"):
        arm.request({"op": "round", "index": 0})
    arm.close()
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # gone
    with pytest.raises(ArmError, match="the worker is not running"):
        arm.request({"op": "hello"})
    assert arm.failed and arm.log_path.exists()  # kept: the errors above named it
    arm.log_path.unlink()


def fake_tree(tmp_path: Path, body: str) -> revision.Tree:
    """A tree whose worker (python -m fakeworker) runs `body` after answering hello like a real one."""
    (tmp_path / "harness").mkdir(exist_ok=True)
    (tmp_path / "fakeworker.py").write_text(
        "import json, os, sys, time\n"
        "sys.stdin.readline()\n"
        f"print(json.dumps({{'ok': True, 'protocol': {PROTOCOL!r}, 'harness': os.path.join(os.getcwd(), 'harness')}}),"
        " flush=True)\n" + body)
    return revision.Tree(tmp_path, "0" * 40, "fake", worker="fakeworker")


def test_a_worker_that_writes_half_a_line_is_an_error_in_time_not_a_hang(tmp_path):
    arm = Arm("base", fake_tree(tmp_path, "sys.stdin.readline()\nsys.stdout.write('{\"ok\": tr')\n"
                                          "sys.stdout.flush()\ntime.sleep(60)\n"), timeout_s=60)
    arm.start()
    start = time.monotonic()
    with pytest.raises(ArmError, match=r"base \(fake, 000000000000\): wrote part of a line \('\{\"ok\": tr'\) and "
                                       r"then nothing to round in 2 s; the worker was killed \(log: "):
        arm.request({"op": "round"}, timeout_s=2)
    assert time.monotonic() - start < 10
    assert arm.process is None and arm.failed and arm.log_path.exists()  # the log the message names is kept
    arm.log_path.unlink()


def test_stray_output_from_a_worker_names_the_arm(tmp_path):
    arm = Arm("candidate", fake_tree(tmp_path, "sys.stdin.readline()\nprint('loading weights...', flush=True)\n"
                                               "sys.stdin.readline()\n"), timeout_s=60)
    arm.start()
    with pytest.raises(ArmError, match=r"candidate \(fake, .*\): answered load with a line that is not JSON: "
                                       r"'loading weights...'"):
        arm.request({"op": "load"}, timeout_s=10)
    assert arm.process is None  # a worker off the protocol is killed, not asked to quit
    arm.log_path.unlink()


def test_a_worker_dies_with_a_killed_controller_and_its_log_is_swept(tmp_path):
    """SIGKILL of the controller runs no clean-up: the worker dies with it anyway (parent-death signal),
    and the next gate removes the dead controller's worker log."""
    fake_tree(tmp_path, "time.sleep(120)\n")
    controller = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from harness.perf.ab import revision; "
         "from harness.perf.ab.arms import Arm; "
         f"a = Arm('base', revision.Tree(Path({str(tmp_path)!r}), '0' * 40, 'fake', worker='fakeworker')); "
         "a.start(); print(a.process.pid, a.log_path, flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    pid, log_path = controller.stdout.readline().split()
    assert Path(f"/proc/{pid}").exists()
    controller.kill()
    controller.wait()
    assert wait_for(lambda: not Path(f"/proc/{pid}").exists(), 5), "the worker outlived its controller"
    assert Path(log_path).exists()
    following = Arm("next", fake_tree(tmp_path, ""))  # a new arm sweeps what dead controllers left
    assert not Path(log_path).exists()
    following.discard_log()


def test_a_worker_of_this_interpreter_keeps_its_pythonpath_another_environment_does_not(tmp_path, monkeypatch):
    """Packages on this process's PYTHONPATH (pip install --target) import in a worker of the same
    interpreter, after its tree; a worker of another environment sees its tree alone, so that
    its own packages are the ones it measures."""
    site = tmp_path / "site"
    monkeypatch.setenv("PYTHONPATH", str(site))
    tree = fake_tree(tmp_path, "sys.stdin.readline()\n"
                               "print(json.dumps({'ok': True, 'path': os.environ['PYTHONPATH']}), flush=True)\n")
    other = tmp_path / "other-python"
    other.symlink_to(sys.executable)  # another interpreter path: another environment to the gate
    for environment, expected in ((None, [str(tree.path), str(site)]),
                                  (Environment(str(other), "--perf-base-python"), [str(tree.path)])):
        arm = Arm("base", tree, timeout_s=60, environment=environment)
        arm.start()
        try:
            assert arm.request({"op": "path"}, timeout_s=30)["path"].split(os.pathsep) == expected
        finally:
            arm.close()
            arm.discard_log()


def test_a_finished_gate_leaves_no_worker_log(tmp_path):
    arm = Arm("base", fake_tree(tmp_path, "sys.stdin.readline()\n"), timeout_s=60)
    arm.start()
    arm.close()
    arm.discard_log()
    assert not arm.log_path.exists()


def test_a_failed_checkout_reports_git_s_reason_not_its_first_line():
    stderr = "Preparing worktree (detached HEAD 1234567)\nfatal: '/x/y' already exists\n"
    assert revision._git_error(stderr) == "fatal: '/x/y' already exists"
    assert revision._git_error("Preparing worktree\nsomething odd\n") == "something odd"
