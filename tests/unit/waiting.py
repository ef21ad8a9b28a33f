"""Waiting in tests for something another process does: poll a check until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], object], seconds: float = 20.0, every: float = 0.05) -> bool:
    """True as soon as `check()` is true; False when it is still false after `seconds` (checked once more
    at the deadline, so a slow last poll is not a false failure)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())
