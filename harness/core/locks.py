"""Exclusive locks across processes, and the leftovers of processes that were killed.

A lock is an fcntl lock on a file that holds its owner's process id: a second process waits,
saying who holds it, and the kernel releases it when its owner exits, however it exits. A lock
file is deleted only once the file or folder it guards is gone and nobody holds it
(`sweep_orphans`): deleting one that guards something alive, while another process waits on it,
could let two in.

A temporary file or folder that must not outlive its run carries its owner's process id in its
name (`owned_name`); `sweep` removes those whose owner no longer runs, so what a SIGKILL left is
cleaned by the next run, and never what a live run is still using.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)


PID_FIELD = 21  # a lock file starts with its holder's process id, padded, and a newline


@contextlib.contextmanager
def held(path: Path, *, what: str, on_wait: Callable[[str], None] | None = None,
         guards: Path | None = None) -> Iterator[None]:
    """Hold the lock at `path` for the block; `on_wait` hears one line when another process holds it.
    `guards`: the file or folder the lock stands for (a baselines folder, a repository), written
    into the lock file, so that the lock is swept once that is gone (a test's temporary folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_orphans(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            (on_wait or log.warning)(f"{what}: waiting for process {_holder(fd)}, which holds {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        _claim(fd, guards)
        yield
    finally:
        os.close(fd)  # releases the lock


def _claim(fd: int, guards: Path | None) -> None:
    """Write the holder's pid and the guarded path into a lock just taken."""
    guarded = str(Path(guards).resolve()) if guards is not None else ""
    # one write: never empty once written; a lock's name is a hash of what it guards, so the
    # length never changes between holders
    os.pwrite(fd, f"{os.getpid():<{PID_FIELD - 1}}\n{guarded}\n".encode(), 0)


@contextlib.contextmanager
def taken_if_free(path: Path, *, guards: Path | None = None) -> Iterator[bool]:
    """Take the lock at `path` for the block if nobody holds it (True), else do not wait (False):
    for tidying what a lock stands for only while nobody uses it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        _claim(fd, guards)
        yield True
    finally:
        os.close(fd)


def sweep_orphans(folder: Path) -> list[Path]:
    """Remove the lock files in `folder` whose guarded file or folder no longer exists and that no
    process holds. A lock without a guarded path (a model's fetch, an environment's build: named,
    not a path) is kept. A process that opened such a file before the removal and waits on it
    would share the lock with the next one, but both would be working on a path that is gone."""
    removed = []
    for path in sorted(Path(folder).glob("*.lock")) if Path(folder).is_dir() else []:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            guarded = _guarded(fd)
            if not guarded or Path(guarded).exists():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: its holder is still at work
            if _guarded(fd) == guarded:
                path.unlink(missing_ok=True)
                removed.append(path)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d lock file(s) whose folder is gone: %s", len(removed), ", ".join(p.name for p in removed))
    return removed


def _guarded(fd: int) -> str:
    """The guarded path a lock file names after its holder's id ("" where it names none)."""
    return os.pread(fd, 4096, PID_FIELD).decode("utf-8", "replace").split("\n", 1)[0].strip()


def _holder(fd: int, patience_s: float = 2.0) -> str:
    """The process id in a held lock file. The holder writes it just after taking the lock, so for a
    moment the file may be empty or still name the previous holder: wait for a live process's id."""
    deadline = time.monotonic() + patience_s
    while True:
        text = os.pread(fd, PID_FIELD, 0).decode("ascii", "replace").strip()
        if text.isdigit() and text != str(os.getpid()) and _alive(int(text)):
            return text
        if time.monotonic() >= deadline:
            return "unknown"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def dies_with_parent() -> list[str]:
    """A command prefix that makes the started program die with the process that starts it, even when
    that one is killed and runs no clean-up (util-linux's setpriv; nothing where it is missing)."""
    return ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


def path_key(path: Path) -> str:
    """A short name for a file or folder, the same from any working directory (lock names per repository
    or per baseline file)."""
    return hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:12]


def owned_name(prefix: str) -> str:
    """`prefix` followed by this process's id and a dash: the start of a name `sweep` understands."""
    return f"{prefix}{os.getpid()}-"


def owner_gone(name: str, prefix: str) -> bool:
    """True when `name` (made with owned_name(prefix)) belongs to a process that no longer runs."""
    pid = name[len(prefix):].split("-", 1)[0]
    if not name.startswith(prefix) or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def sweep(folder: Path, prefix: str, remove: Callable[[Path], None] | None = None) -> list[Path]:
    """Remove the entries of `folder` named with owned_name(prefix) whose owner is gone."""
    gone = [p for p in Path(folder).glob(f"{prefix}*") if owner_gone(p.name, prefix)] if Path(folder).is_dir() else []
    for path in gone:
        if remove is not None:
            remove(path)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if gone:
        log.info("removed what killed runs left: %s", ", ".join(str(p) for p in gone))
    return gone
