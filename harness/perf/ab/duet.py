"""Side-by-side arms (`--perf-duet`): both arms measure each round at the same time, each worker
pinned to a core of its own with one intra-op thread; the arms swap cores every round, and within a
round exchange them every `--perf-duet-swap` seconds.

Why: on a shared 2-core VM two threads of one process wait on each other, and that spread is most
of the A/B gate's noise there; one thread per process is several times steadier, and two such
processes side by side cost each other little (docs/gate-studies.md, "One thread an arm", has the
measurements). Running both arms at once also puts whatever the host does in that minute on both;
swapping the cores every round cancels a steady offset between the two cores, and exchanging them every fraction of a
second within the round cancels the spells in which one core runs slower than the other for
seconds (on the AMD EPYC Zen 3 VM that cut the per-round spread of plain tokens/s from 7.4% to
0.9%: docs/gate-studies.md, "Exchanging cores within a round").

Everything here is done to the worker from outside (its environment at start, the affinity of
every thread it has), so a base revision from before duet runs side by side too.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from harness.machine import affinity
from harness.core.errors import UnsupportedHereError

OPTION = "--perf-duet"
SWAP_OPTION = "--perf-duet-swap"
SYNC_OPTION = "--perf-duet-sync"
CHOICES = ("on", "off", "auto")
# the default period of the exchange within a round (docs/gate-studies.md, "Exchanging cores within a round")
SWAP_S = 0.05
MIN_SWAP_S = 0.05   # shorter: the controller's wake-ups and the moves start to cost the arms
DUET, INTERLEAVED = "duet", "interleaved"
# The thread pools a worker may start, each held to one thread: torch's intra-op pool reads
# OMP_NUM_THREADS; MKL and OpenBLAS have their own.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


log = logging.getLogger(__name__)


class DuetError(UnsupportedHereError):
    """Side-by-side arms asked for where they cannot run."""


@dataclass(frozen=True)
class Plan:
    """How the A/B gate runs its arms, resolved once at the start of a gate run."""
    mode: str                          # DUET or INTERLEAVED
    cores: tuple[int, int] | None      # DUET: the two cores the arms take in turn
    reason: str                        # why this mode (a line of the run's notes)
    choice: str = "off"                # what --perf-duet asked for: on | off | auto
    swap_s: float | None = None        # DUET: the arms also exchange cores every swap_s seconds within a round
    sync: bool = False                 # DUET: both arms start each run of a round (a prompt in one mode) together

    @property
    def duet(self) -> bool:
        return self.mode == DUET

    def core(self, arm_index: int, round_index: int) -> int | None:
        """The core of arm 0 or 1 in a round: the arms swap cores every round."""
        if self.cores is None:
            return None
        return self.cores[(arm_index + round_index) % 2]

    def env(self) -> dict[str, str]:
        return dict(ONE_THREAD) if self.duet else {}


IN_TURN = Plan(INTERLEAVED, None, f"{OPTION} off: the arms take turns, each with every core")


def plan(choice: str, cores: list[int] | None = None, swap_s: float = SWAP_S, sync: bool = False) -> Plan:
    """The mode for --perf-duet on|off|auto, --perf-duet-swap SECONDS (0: the arms swap cores
    between rounds only) and --perf-duet-sync on|off. `on` with fewer than 2 cores is an error naming
    the option; `auto` runs side by side when 2 cores are there, and says so either way."""
    if choice not in CHOICES:
        raise DuetError(f"{OPTION} {choice!r}: choose one of {', '.join(CHOICES)}")
    if not (swap_s == 0 or MIN_SWAP_S <= swap_s):  # also refuses NaN
        raise DuetError(f"{SWAP_OPTION} {swap_s:g}: give 0 (swap cores between rounds only) or a period of at "
                        f"least {MIN_SWAP_S:g} seconds (default {SWAP_S:g})")
    if choice == "off":
        if sync:
            raise DuetError(f"{SYNC_OPTION} on: the arms take turns under {OPTION} off, so there is nothing to start "
                            f"together; pass {OPTION} on or auto")
        return IN_TURN
    cores = affinity.allowed_cores() if cores is None else cores
    if len(cores) < 2:
        why = (f"this process may run on {len(cores)} core(s) ({cores}); side-by-side arms need 2 "
               "(widen the CPU affinity, e.g. taskset -c 0,1)")
        if choice == "on":
            raise DuetError(f"{OPTION} on: {why}, or pass {OPTION} off")
        return Plan(INTERLEAVED, None, f"{OPTION} auto: {why}: the arms take turns{_nothing_to_sync(sync)}", choice)
    pair = (cores[0], cores[1])
    within = f", and every {swap_s:g} s within a round" if swap_s else f" ({SWAP_OPTION} 0)"
    together = "; both start each run of a round together" if sync else ""
    return Plan(DUET, pair, f"{OPTION} {choice}: the arms run side by side, one thread each, on cores "
                            f"{pair[0]} and {pair[1]}, swapping every round{within}{together}", choice, swap_s or None,
                sync)


def for_device(run_plan: Plan, device: str, combination: str) -> Plan:
    """The mode of one combination: side by side is for the CPU. On a GPU both arms would send
    their kernels to the one device at once, so each arm's time would hold the other's work: the
    arms take turns there (`auto`), and `on` is an error naming the option."""
    if not run_plan.duet or device == "cpu":
        return run_plan
    why = f"{combination} runs on {device}, and side by side both arms would share that one {device} device"
    if run_plan.choice == "on":
        raise DuetError(f"{OPTION} on: {why}; pass {OPTION} auto (its arms then take turns) or off, "
                        "or gate the CPU combinations alone (--perf-platform cpu)")
    return Plan(INTERLEAVED, None, f"{OPTION} auto: {device} combinations take turns, each arm with the whole "
                                   f"device (side by side both arms would share it){_nothing_to_sync(run_plan.sync)}",
                run_plan.choice)


def _nothing_to_sync(sync: bool) -> str:
    """What a plan whose arms take turns adds to its reason where --perf-duet-sync on was asked."""
    return f"; {SYNC_OPTION} on has no arms side by side to start together" if sync else ""


def pin(pid: int, core: int) -> None:
    """Pin every thread of process `pid` to `core` (threads it starts later inherit it). A thread
    that ends meanwhile is passed over; a process that cannot be pinned is an error."""
    try:
        pinned = affinity.pin_threads(pid, {core})
    except FileNotFoundError as exc:  # the process is gone: no threads to list
        raise DuetError(f"{OPTION}: cannot list the threads of worker {pid} ({exc})") from None
    except OSError as exc:
        raise DuetError(f"{OPTION}: cannot pin worker {pid} to core {core} ({exc}); pass {OPTION} off") from None
    if not pinned:
        raise DuetError(f"{OPTION}: worker {pid} has no thread left to pin")


class Swapping:
    """Within a round, the two arms exchange cores every `period` seconds, from a thread of the
    controller, until the round's answers are in (`with Swapping(...)`).

    Why: on a shared VM one core's speed can drift from the other's for seconds at a time (another
    guest on the host core behind it), and swapping once per round leaves that in the round's
    ratio. Exchanging every fraction of a second gives each arm an equal share of both cores'
    spells. A move costs the thread its core-private caches, a few hundred KB, against steps that
    stream hundreds of MB of weights."""

    def __init__(self, pids: tuple[int, int], cores: tuple[int, int], period: float):
        self.pids, self.cores, self.period = pids, cores, period
        self.swaps = 0
        self._lock = threading.Lock()  # an exchange's moves, or a substitution, at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duet-swap", daemon=True)

    def __enter__(self) -> Swapping:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def moves(self, n: int) -> list[tuple[int, int]]:
        """The n-th exchange (from 1) as (pid, core) moves, in order: each arm to the core the other
        holds. The arm moved first shares that core with the other until the other is moved off, so
        the first mover alternates between the arms and each waits as often as the other (a fixed
        order leaned the gate towards the arm moved second: docs/gate-studies.md, "Which arm moves first")."""
        flip = n % 2
        return [(self.pids[i], self.cores[(i + flip) % 2]) for i in ((0, 1) if flip else (1, 0))]

    def substitute(self, pid: int, other: int) -> None:
        """Process `other` takes the place of `pid` from now on: pinned to the core `pid` holds, and
        moved instead of it at every exchange (harness/perf/ab/standin.py: an arm's round has ended)."""
        with self._lock:
            i = self.pids.index(pid)
            pin(other, self._across(self.pids[1 - i], self.cores[(i + self.swaps) % 2]))
            self.pids = (other, self.pids[1]) if i == 0 else (self.pids[0], other)

    def _across(self, partner: int, expected: int) -> int:
        """The core across from `partner`'s: after n exchanges pids[i] is on cores[(i + n) % 2]
        (`expected`), unless an exchange stopped half done (a process that ended): then the core the
        partner does not hold, so that two processes never share one."""
        try:
            held = os.sched_getaffinity(partner)
        except OSError:  # the partner ended: nothing to share a core with
            return expected
        free = [core for core in self.cores if core not in held]
        return free[0] if len(held) == 1 and len(free) == 1 else expected

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self._lock:
                self.swaps += 1
                try:
                    for pid, core in self.moves(self.swaps):
                        pin(pid, core)
                except DuetError as exc:  # a worker that ended: the round's answer says why
                    log.warning("%s; the arms stop exchanging cores for this round", exc)
                    return
