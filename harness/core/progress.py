"""Progress of a long operation: a bar redrawn in place on a terminal, one log line per finished
step anywhere else.

A CI log or a file that stderr is redirected to gets no carriage-return redraws: each finished step
is one INFO line of the `harness.progress` logger ("bench smollm2-135m+self: 3/16 run, general/1
plain 17.3 tok/s, 41 s"); a byte count logs one line per tenth. The libraries' own bars (transformers'
"Loading weights") are switched off there too. Which one a run gets is decided here only.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

log = logging.getLogger("harness.progress")


def on_terminal(stream: TextIO | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Steps:
    """tqdm's interface as the suite uses it (update, set_postfix_str, total, close), written as
    log lines: one per finished step, or one per `every` of the total (a tenth for a byte count)."""

    def __init__(self, *, desc: str, total: int | None = None, unit: str = "it", initial: int = 0,
                 every: float = 0.0, enabled: bool = True):
        self.desc, self.total, self.unit, self.n, self.every = desc, total, unit, initial, every
        self.enabled = enabled
        self.postfix = ""
        self.start = time.monotonic()
        self.logged_at = initial

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.every and self.total and self.n < self.total and self.n - self.logged_at < self.every * self.total:
            return
        self._line()

    def close(self) -> None:
        if self.n != self.logged_at:
            self._line()

    def _line(self) -> None:
        self.logged_at = self.n
        if not self.enabled:
            return
        done = self._amount(self.n) + (f"/{self._amount(self.total)}" if self.total else "")
        tail = f", {self.postfix}" if self.postfix else ""
        log.info("%s: %s %s%s, %.0f s", self.desc, done, self.unit, tail, time.monotonic() - self.start)

    def _amount(self, n: int) -> str:
        if self.unit != "B":
            return str(n)
        return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}G"


def bar(*, desc: str, total: int | None = None, unit: str = "it", initial: int = 0, enabled: bool = True,
        stream: TextIO | None = None, every: float | None = None) -> Any:
    """A tqdm bar on `stream` (stderr) when it is a terminal, else Steps; nothing when not enabled.
    `every`: off a terminal, one log line per this share of the total (default: a tenth for bytes,
    else each step)."""
    stream = sys.stderr if stream is None else stream
    if enabled and on_terminal(stream):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial, unit_scale=unit == "B", file=stream)
    every = (0.1 if unit == "B" else 0.0) if every is None else every
    return Steps(desc=desc, total=total, unit=unit, initial=initial, every=every, enabled=enabled)


def library_bars_off_unless_terminal(stream: TextIO | None = None) -> None:
    """transformers and huggingface_hub draw their own bars (loading weights, downloads): off where
    stderr is not a terminal, so a log holds no redraws."""
    if on_terminal(stream):
        return
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:  # pragma: no cover - transformers requires huggingface_hub
        return
    disable_progress_bars()
