"""Clocks: the median time of repeated calls (the one timing loop behind the kernel table
harness/machine/kernels.py, the step costs harness/machine/predict.py and the host-speed probe
harness/machine/hostspeed.py), a clock that waits for a device's queued work (generate.py), and the
calling thread's page faults (the perf gate's rounds)."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], object], *, min_calls: int = 5, min_seconds: float = 0.0) -> float:
    """Median seconds of `fn` over at least `min_calls` calls and `min_seconds`, after one warm-up
    call (first touch of the pages, kernel selection). The median: a call that the host interrupted
    moves it little."""
    fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < min_calls or spent < min_seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times)


def device_clock(device: Any) -> Callable[[], float]:
    """time.perf_counter, read after `device` finished the work queued on it. A CUDA kernel launch
    returns before the kernel ran, so a clock read that ends GPU work without a synchronize
    measures launches; on a CPU the work is done when the call returns and nothing waits."""
    if getattr(device, "type", device) != "cuda":
        return time.perf_counter
    import torch

    def read() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return read


def thread_page_faults() -> int | None:
    """Page faults the calling thread has taken so far, minor and major (getrusage RUSAGE_THREAD):
    each minor one is a page of memory touched for the first time, which the kernel must find and
    zero, and it is charged to the thread's CPU time. A page is 4 KiB, or 2 MiB where transparent huge
    pages serve the memory (`always` in /sys/kernel/mm/transparent_hugepage/enabled): there a grown
    heap takes a few faults per 2 MiB. None where the system has no per-thread count."""
    who = getattr(resource, "RUSAGE_THREAD", None)  # Linux
    if who is None:
        return None
    usage = resource.getrusage(who)
    return usage.ru_minflt + usage.ru_majflt
