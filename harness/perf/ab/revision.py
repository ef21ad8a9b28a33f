"""The base arm's code: a git revision checked out as a detached worktree in the cache.

`--perf-against REV` takes any revision git understands (sha, branch, tag, HEAD~1). It is
resolved to a commit, checked out once under <cache>/worktrees/<sha> (reused while it stays
clean and at that commit) and checked for the worker entry point. Every failure is one
line that names the option or the revision and what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import UnsupportedHereError
from harness.core import cacheprune, locks
from harness.workload.models import cache_root, lock_file

log = logging.getLogger(__name__)

# The worker's file in a tree, newest layout first: a base revision from before the perf package
# had its ab/ room keeps its worker at the old path, and the controller starts whichever it has.
WORKERS = ("harness/perf/ab/worker.py", "harness/perf/worker.py")
WORKER = WORKERS[0]
OPTION = "--perf-against"


class RevisionError(UnsupportedHereError):
    """A base revision that cannot be measured."""


@dataclass(frozen=True)
class Tree:
    """Code an arm runs: a folder and the commit it holds (the candidate's tree may be dirty)."""

    path: Path
    commit: str
    label: str  # what the user named: the revision, or "working tree"
    worker: str = "harness.perf.ab.worker"  # the module its worker runs as (python -m)


def _git(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise RevisionError(f"{OPTION}: git is not installed; the A/B gate needs it") from None
    except subprocess.TimeoutExpired:
        raise RevisionError(f"{OPTION}: git {' '.join(args)} did not finish in {timeout:.0f} s "
                            f"(a lock held by another git process in {repo}?)") from None


def _git_error(stderr: str) -> str:
    """git's own reason: its fatal:/error: line, else its last line ("Preparing worktree" comes first)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[-1] if lines else "no message")


def gate_lock(repo: Path) -> Path:
    """The lock that one A/B gate of a repository holds while it checks out and measures: a second
    gate on the same machine would share its cores and measure both arms of both gates wrong."""
    return lock_file(f"ab-gate-{locks.path_key(repo)}")


def repository_root(start: Path) -> Path:
    r = _git(start, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise RevisionError(f"{OPTION}: {start} is not inside a git repository ({_git_error(r.stderr)})")
    return Path(r.stdout.strip())


def resolve(repo: Path, rev: str) -> str:
    """The full sha of `rev`, or an error that says how to name a revision."""
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if r.returncode != 0 or not r.stdout.strip():
        if _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            raise RevisionError(f"{OPTION} {rev}: no such revision in {repo}, a shallow clone: fetch its history "
                                "(`git fetch --unshallow`; in a CI checkout, a fetch depth of 0: docs/ci.md)")
        raise RevisionError(f"{OPTION} {rev}: no such revision in {repo}; give a sha, branch or tag "
                            "(`git log --oneline` lists them)")
    return r.stdout.strip()


def check_worker(repo: Path, rev: str, sha: str) -> str:
    """The module of the commit's A/B worker; an error when it has none."""
    for path in WORKERS:
        if _git(repo, "cat-file", "-e", f"{sha}:{path}").returncode == 0:
            return path[:-len(".py")].replace("/", ".")
    raise RevisionError(f"{OPTION} {rev}: commit {sha[:12]} has no A/B worker ({WORKER}): it predates the A/B "
                        "gate; choose a newer revision as the base")


def checkout(repo: Path, rev: str, root: Path | None = None, label: str | None = None) -> Tree:
    """A clean detached worktree of `rev` under <cache>/worktrees/<sha>, made or reused; in the
    cache, the worktrees that can no longer be used or were not used for weeks go (`prune_worktrees`)."""
    tree = _checkout(repo, rev, root, label)
    if root is None:
        prune_worktrees(tree.path.parent.parent, keep=tree.path)
    return tree


def _checkout(repo: Path, rev: str, root: Path | None, label: str | None) -> Tree:
    sha = resolve(repo, rev)
    worker = check_worker(repo, rev, sha)
    # one folder per repository: a worktree belongs to the repository that made it
    path = (root or cache_root() / "worktrees" / hashlib.sha256(str(repo).encode()).hexdigest()[:8]) / sha
    if path.exists():
        head = _git(path, "rev-parse", "HEAD")
        if head.returncode != 0:  # not a checkout any more (its repository moved): make it again
            shutil.rmtree(path)
            return _checkout(repo, rev, root, label)
        lock = _lock_file(path)
        if lock.exists():
            raise RevisionError(f"{OPTION} {rev}: the worktree {path} is locked by a git lock file (another git "
                                f"process is using it, or one crashed there); wait for it, or remove {lock} if no "
                                "git process runs")
        status = _git(path, "status", "--porcelain", "--untracked-files=no")
        if head.stdout.strip() == sha and status.returncode == 0 and not status.stdout.strip():
            cacheprune.mark_used(path)
            return Tree(path, sha, label or rev, worker)
        raise RevisionError(f"{OPTION} {rev}: the worktree {path} is not a clean checkout of {sha[:12]} (edited, "
                            f"or left by an interrupted run); remove it with `git worktree remove --force {path}`")
    path.parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "worktree", "prune")
    r = _git(repo, "worktree", "add", "--detach", str(path), sha)
    if r.returncode != 0 and "locked" in r.stderr:
        raise RevisionError(f"{OPTION} {rev}: git keeps a locked worktree registered at {path} (`git worktree "
                            f"lock`); unlock it with `git worktree unlock {path}`, then run again")
    if r.returncode != 0:
        raise RevisionError(f"{OPTION} {rev}: could not check out {sha[:12]} at {path}: {_git_error(r.stderr)}")
    log.info("base %s (%s) checked out at %s", rev, sha[:12], path)
    return Tree(path, sha, label or rev, worker)


def prune_worktrees(root: Path, keep: Path | None = None) -> list[Path]:
    """Remove the worktrees under `root` (<root>/<repository>/<sha>) whose repository is gone (every
    clean CI clone leaves one) or that were not used for cacheprune.UNUSED_DAYS; `keep` stays. A
    removed worktree of a live repository is unregistered from it at once (`_remove_tree`)."""
    entries = [p for p in sorted(Path(root).glob("*/*")) if p.is_dir()] if Path(root).is_dir() else []
    removed = cacheprune.prune(entries, keep=keep, orphan=_repository_gone, remove=_remove_tree, what="base worktree")
    for folder in {p.parent for p in removed}:
        with contextlib.suppress(OSError):
            folder.rmdir()  # the repository's folder, once empty
    return removed


def _remove_tree(path: Path) -> bool:
    """Remove a worktree, and unregister it from its repository where that still exists."""
    common = _git(path, "rev-parse", "--path-format=absolute", "--git-common-dir")
    shutil.rmtree(path)
    if common.returncode == 0 and Path(common.stdout.strip()).is_dir():
        _git(Path(common.stdout.strip()), "worktree", "prune")
    return True


def _repository_gone(worktree: Path) -> bool:
    """A linked worktree's `.git` file names its repository's folder for it: gone with the repository."""
    try:
        text = (worktree / ".git").read_text()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False  # being made, or not a linked worktree: its age decides
    gitdir = text.partition("gitdir:")[2].strip()
    return bool(gitdir) and not Path(gitdir).exists()


def _lock_file(worktree: Path) -> Path:
    """The index lock of a linked worktree: <repo>/.git/worktrees/<name>/index.lock."""
    gitdir = _git(worktree, "rev-parse", "--absolute-git-dir").stdout.strip()
    return Path(gitdir) / "index.lock" if gitdir else worktree / ".git" / "index.lock"


def working_tree(repo: Path) -> Tree:
    """The candidate: the working tree as it is, uncommitted changes included."""
    head = _git(repo, "rev-parse", "HEAD")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    return Tree(repo, commit, "working tree" + (" (uncommitted changes)" if dirty else ""))
