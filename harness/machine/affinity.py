"""CPU affinity: the cores this process may use, and every thread of a process pinned to a set of
cores (threads it starts later inherit it). Linux; elsewhere there is no affinity to read or set.

Used by the A/B gate's side-by-side arms (harness/perf/ab/duet.py, a worker from outside) and by the
stored gate's placement (harness/perf/stored/placement.py, this process)."""

from __future__ import annotations

import os
from pathlib import Path


def allowed_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity), in order; [] where there is none."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity to read or set
        return []


def pin_threads(pid: int, cores: set[int]) -> int:
    """Pin every thread of process `pid` to `cores`; returns how many were pinned. A thread that
    ends meanwhile is passed over; listing the threads or pinning one fails with OSError."""
    pinned = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
            pinned += 1
        except ProcessLookupError:
            continue
    return pinned
