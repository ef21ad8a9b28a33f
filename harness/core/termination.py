"""SIGTERM ends a run the way Ctrl-C does: as an exception, so that every clean-up on the way out runs.

Python's default for SIGTERM is to die at once, running no `finally`: A/B workers and sandboxed runs
would then die only through their parent-death signal, and their logs, run folders and cgroups would
wait for the next run's sweep (harness/core/locks.py). Raised as `Terminated` (a KeyboardInterrupt,
which pytest and the CLI already end on cleanly), the same code that closes them on Ctrl-C closes
them on SIGTERM. A second SIGTERM while that clean-up runs kills outright, as the default would,
unless it comes within DUPLICATE_S of the first: that is the same stop delivered twice, once to the
process group (a cancelled job, `kill -- -PGID`) and once forwarded by a parent (make passes SIGTERM
on to its jobs), and it must not cut the clean-up short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

EXIT_STATUS = 128 + signal.SIGTERM  # what a shell reports for a command that SIGTERM ended
DUPLICATE_S = 2.0  # a SIGTERM this soon after the first is the same stop, delivered twice


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run ends, cleaning up as it goes."""


def _raise_terminated(signum: int, frame: Any) -> None:
    first = time.monotonic()

    def again(signum: int, frame: Any) -> None:
        if time.monotonic() - first < DUPLICATE_S:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a later SIGTERM does not wait for the clean-up
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, again)
    raise Terminated(f"terminated by {signal.Signals(signum).name}")


def install() -> Callable[[], None]:
    """Turn SIGTERM into Terminated in this process; returns what undoes it. Does nothing off the main
    thread (signals go to the main thread only) or where someone else already handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return lambda: None
    previous = signal.signal(signal.SIGTERM, _raise_terminated)

    def undo() -> None:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, previous)

    return undo


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated inside the block."""
    undo = install()
    try:
        yield
    finally:
        undo()
