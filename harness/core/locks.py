"""Exclusive locks across processes, and the leftovers of processes that were killed.

A lock is an fcntl lock on a file that holds its owner's process id: a second process waits,
saying who holds it, and the kernel releases it when its owner exits, however it exits. Lock
files are never deleted (deleting one while another process waits on it would let two in).

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


@contextlib.contextmanager
def held(path: Path, *, what: str, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock at `path` for the block; `on_wait` hears one line when another process holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            (on_wait or log.warning)(f"{what}: waiting for process {_holder(fd)}, which holds {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)  # one fixed-width write: never empty once written
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int, patience_s: float = 2.0) -> str:
    """The process id in a held lock file. The holder writes it just after taking the lock, so for a
    moment the file may be empty or still name the previous holder: wait for a live process's id."""
    deadline = time.monotonic() + patience_s
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
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
