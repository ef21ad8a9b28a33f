"""The host-speed probe: a short fixed measurement that tells whether this host is comparable with
the one that measured a baseline.

Hosts with one platform id (same CPU model, class and cores) differ in speed: plain bf16 decoding
of the 1.5B target ran at 2.6 tokens/s on one Intel host and 4.9 on another. A stored baseline
from the fast one makes the slow one fail, and the other way round hides a regression. The probe
measures what decoding leans on, each as a rate (higher is faster):

- `memory_gbs`: memory bandwidth, GB/s of a sum over a 512 MiB fp32 tensor (beyond the caches);
- `gemv_bf16_gbs`: GB/s of weights streamed by a bf16 one-token linear layer (the decode step's
  kernel: torch.nn.functional.linear, 16384 x 8192, 256 MiB);
- `dispatch_kops`: thousands of small torch ops per second from Python (the per-token overhead
  that dominates small models).

Each is timed REPEATS times after one warm-up (the median rate: a draw), and the probe takes DRAWS
draws of the three in turn, each rate the median of its draws; every draw is kept in the probe. The
whole probe takes a few seconds. `--perf-update-baselines` records it in every record it writes;
the stored gate measures it again and compares (`compare()`): beyond THRESHOLD on any rate, the
host is not comparable and the stored gate defers to the A/B gate.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.timing import median_seconds

VERSION = 1  # a probe of another version measures other things: it is not compared
REPEATS = 7
MEMORY_MIB = 512
GEMV_SHAPE = (16384, 8192)
DISPATCH_OPS = 2000
NAMES = {"memory_gbs": "memory bandwidth", "gemv_bf16_gbs": "bf16 GEMV", "dispatch_kops": "op dispatch"}
UNITS = {"memory_gbs": "GB/s", "gemv_bf16_gbs": "GB/s", "dispatch_kops": "kop/s"}

# THRESHOLD: how far a rate may be from the stored one on a comparable host. It is beyond the probe's
# own spread between fresh processes on an unchanged host (an update and a later gate are separate
# processes) and well inside the difference between hosts of one platform id; a busy host reads
# about half the quiet memory and GEMV rates, and defers. The probe runs in the pytest process
# before the first model loads, in an update and a check alike (after the models have run, memory
# reads faster on the same host). The GEMV layer is 16384 x 8192: an 8192 x 8192 one was bimodal
# between processes. docs/gate-studies.md, "The host-speed probe's spread", has the figures: the
# spread quiet, busy, with two threads and with one pinned thread (the stored gate's default,
# harness/perf/stored/placement.py), and the processes whose rates ran about twice the usual.
THRESHOLD = 0.25

# DRAWS: on a host whose one-thread rates dip for about a second now and then (the AMD EPYC Zen 4
# VM), a probe of one draw that caught a dip deferred a check on its own host; the median of three
# draws in turn leaves out one dip. docs/gate-studies.md, "Three draws", has the deferral rates of
# one draw and of three on that host.
DRAWS = 3


def _median_rate(run: Callable[[], None], amount: float, repeats: int) -> float:
    return amount / median_seconds(run, min_calls=repeats)


class _Kernels:
    """The probe's three kernels, their tensors allocated once for every draw."""

    def __init__(self) -> None:
        import torch

        self.big = torch.ones(MEMORY_MIB * 2**20 // 4, dtype=torch.float32)
        self.weight = torch.full(GEMV_SHAPE, 0.01, dtype=torch.bfloat16)
        self.x = torch.ones(1, GEMV_SHAPE[1], dtype=torch.bfloat16)
        self.small = torch.ones(64)
        self._gemv = functools.partial(torch.nn.functional.linear, self.x, self.weight)  # no lookup inside the timing

    def _dispatch(self) -> None:
        for _ in range(DISPATCH_OPS):
            self.small.add(1.0)

    def draw(self, repeats: int) -> dict[str, float]:
        """One draw: each rate once, the median of `repeats` timed calls."""
        return {"memory_gbs": _median_rate(self.big.sum, self.big.numel() * 4 / 1e9, repeats),
                "gemv_bf16_gbs": _median_rate(self._gemv, self.weight.numel() * 2 / 1e9, repeats),
                "dispatch_kops": _median_rate(self._dispatch, DISPATCH_OPS / 1e3, repeats)}


def measure(repeats: int = REPEATS, draws: int = DRAWS) -> dict[str, Any]:
    """This host's probe, as recorded in a baseline: {version, threads, repeats, draws, seconds,
    rates, draw_rates}; each rate is the median of its `draws` draws."""
    import torch

    started = time.perf_counter()
    with torch.inference_mode():
        kernels = _Kernels()
        taken = [kernels.draw(repeats) for _ in range(draws)]
    rates = {m: statistics.median(d[m] for d in taken) for m in NAMES}
    return {"version": VERSION, "threads": torch.get_num_threads(), "repeats": repeats, "draws": draws,
            "seconds": round(time.perf_counter() - started, 3), "rates": {k: round(v, 4) for k, v in rates.items()},
            "draw_rates": [{k: round(v, 4) for k, v in d.items()} for d in taken]}


@dataclass(frozen=True)
class HostComparison:
    """This host's probe against a stored one: each rate's ratio (here / there) and the verdict."""

    ratios: dict[str, float]
    threshold: float
    threads: tuple[int, int]  # (there, here)

    @property
    def worst(self) -> str:
        return max(self.ratios, key=lambda m: abs(self.ratios[m] - 1))

    @property
    def comparable(self) -> bool:
        return all(abs(r - 1) <= self.threshold for r in self.ratios.values())

    def describe(self, stored: Mapping[str, Any], here: Mapping[str, Any]) -> str:
        """`memory bandwidth 8.1 vs 10.5 GB/s (-23%), ...` for every rate."""
        parts = [f"{NAMES.get(m, m)} {here['rates'][m]:.3g} vs {stored['rates'][m]:.3g} {UNITS.get(m, '')} "
                 f"({(r - 1) * 100:+.0f}%)" for m, r in self.ratios.items()]
        if self.threads[0] != self.threads[1]:
            parts.append(f"{self.threads[1]} threads here, {self.threads[0]} there")
        return ", ".join(parts)

    def headline(self) -> str:
        """`23% slower` or `31% faster`: the rate furthest from the stored one."""
        r = self.ratios[self.worst]
        return f"{abs(r - 1) * 100:.0f}% {'slower' if r < 1 else 'faster'} ({NAMES.get(self.worst, self.worst)})"


def compare(stored: Mapping[str, Any], here: Mapping[str, Any], threshold: float = THRESHOLD) -> HostComparison | None:
    """None when the two cannot be compared (another probe version, no rate in common)."""
    if stored.get("version") != here.get("version"):
        return None
    common = [m for m in here["rates"] if m in stored.get("rates", {})]
    if not common:
        return None
    return HostComparison({m: here["rates"][m] / stored["rates"][m] for m in common}, threshold,
                          (int(stored.get("threads", 0)), int(here.get("threads", 0))))
