"""Where the stored-baseline gate measures (`--perf-threads`): with one intra-op thread pinned to
one core (`one`, the default), or with torch's threads on every core the process may use (`all`).

Why one: on a shared 2-core VM two threads of one process wait on each other, and that spread is
most of the noise there; one thread pinned to a core is several times steadier (docs/gate-studies.md,
"One thread for the stored gate", has the measurements). The host-speed probe is measured the same way, so the probe of an update and
of a later check compare like with like. What one thread cannot see: a change in how a step scales
over threads; `--perf-threads all` measures that (with its spread).

A baseline records the placement it was measured with (`threads`); a check with another one is
refused as a baseline of other work (harness/perf/stored/verdict.py check_placement). The A/B gate
has its own arrangement (harness/perf/ab/duet.py) and is not touched by this.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from harness.machine import affinity
from harness.core.errors import UnsupportedHereError

OPTION = "--perf-threads"
ONE, ALL = "one", "all"
CHOICES = (ONE, ALL)


class PlacementError(UnsupportedHereError):
    """The measuring process cannot be placed as asked."""


@dataclass(frozen=True)
class Placement:
    """How the stored gate's probe and rounds run, resolved once per session."""
    threads: str            # ONE or ALL: the value a baseline records and a check must share
    core: int | None        # ONE: the core every thread of this process is pinned to while measuring; ALL: None
    reason: str             # a line of the run's notes

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """ONE: torch at one intra-op thread and every thread of this process on `core`, for the
        block; the threads and affinity this process had are restored after it. ALL: as is."""
        if self.core is None:  # ALL
            yield
            return
        import torch

        threads, allowed = torch.get_num_threads(), os.sched_getaffinity(0)
        torch.set_num_threads(1)
        try:
            affinity.pin_threads(os.getpid(), {self.core})
        except OSError as exc:
            torch.set_num_threads(threads)
            raise PlacementError(f"{OPTION} one: cannot pin this process to core {self.core} ({exc}); "
                                 f"pass {OPTION} all") from None
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            affinity.pin_threads(os.getpid(), allowed)


EVERY_CORE = Placement(ALL, None, f"{OPTION} all: the stored gate measures with torch's threads on every core "
                                  "this process may use")


def resolve(choice: str, cores: list[int] | None = None) -> Placement:
    """The placement for --perf-threads one|all; `cores`: the cores this process may use (its
    affinity, read when not given)."""
    if choice not in CHOICES:
        raise PlacementError(f"{OPTION} {choice!r}: choose one of {', '.join(CHOICES)}")
    if choice == ALL:
        return EVERY_CORE
    cores = affinity.allowed_cores() if cores is None else cores
    if not cores:
        raise PlacementError(f"{OPTION} one: this platform has no CPU affinity to pin to; pass {OPTION} all")
    return Placement(ONE, cores[0], f"{OPTION} one: the stored gate measures with one thread pinned to core "
                                    f"{cores[0]} (steadier on a shared host; {OPTION} all for every core)")
