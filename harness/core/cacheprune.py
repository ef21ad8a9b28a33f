"""What the caches of built things keep: the base revisions' worktrees, the overlay environments
and the quantized checkpoints.

Each is made once and reused (harness/perf/ab/revision.py, harness/perf/ab/environment.py,
quant/cache.py), and each clean clone or base revision adds a worktree (about 6 MB), each base
environment an environment (125 MB), each model folder, method and torch version a checkpoint
(0.1-1.5 GB). An entry goes when it can no longer be used, or has not been used for UNUSED_DAYS:
- an orphan: what it stands on is gone (a worktree whose repository was deleted, as every CI clone
  is; an environment whose parent Python was deleted; a checkpoint whose model folder was deleted,
  as every test's temporary model is);
- unused: its modification time is its last use (`mark_used` at every reuse).
The entry being used now is never removed, and a caller removes an entry only where nobody else
can be using it (its lock, taken without waiting; a checkpoint needs none: a reader that has it
open keeps reading it, and one that finds it gone quantizes again).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

UNUSED_DAYS = 14.0


def mark_used(path: Path) -> None:
    """Record a use of the cache entry at `path` (its folder's modification time)."""
    try:
        os.utime(path)
    except OSError as exc:
        log.debug("%s: last use not recorded: %s", path, exc)


def days_unused(path: Path, now: float | None = None) -> float:
    return ((now if now is not None else time.time()) - path.stat().st_mtime) / 86400


def prune(entries: Iterable[Path], *, keep: Path | None, orphan: Callable[[Path], bool],
          remove: Callable[[Path], bool], days: float = UNUSED_DAYS, what: str = "cache entry") -> list[Path]:
    """Remove the `entries` (but `keep`) that are orphans or unused for more than `days`; `remove`
    returns False where it left an entry alone (in use). Each removal is logged with its reason."""
    now = time.time()
    removed: list[tuple[Path, str]] = []
    for path in entries:
        if keep is not None and path == keep:
            continue
        try:
            idle = days_unused(path, now)
            why = "its base is gone" if orphan(path) else (f"unused for {idle:.0f} days" if idle > days else None)
        except OSError:
            continue  # went while we looked
        if why is None:
            continue
        try:
            if remove(path):
                removed.append((path, why))
        except OSError as exc:
            log.warning("%s %s not removed: %s", what, path, exc)
    for path, why in removed:
        log.info("removed the %s %s: %s", what, path, why)
    return [path for path, _ in removed]
