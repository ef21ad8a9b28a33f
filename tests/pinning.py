"""A pytest plugin for pytest-xdist runs (make test's parallel stage, `-n 2`): each worker runs on its
own share of the cores this process may use, with as many torch threads. Two workers each spinning
two threads on two cores would wait on each other; the child processes a test starts inherit the
pinning. Outside xdist, or with more workers than cores, nothing changes. Tests whose result depends
on time measured live carry the `alone` marker and run after, with the machine to themselves
(Makefile, `unit`). Loaded by tests/conftest.py; tests/unit/test_pinning.py runs it in a child pytest."""

from __future__ import annotations

import os
import sys

from harness.machine import affinity


def worker_cores(worker: str, count: int, cores: list[int]) -> list[int] | None:
    """The cores of xdist worker `worker` ("gw<i>") among `count` workers, or None where there are
    fewer cores than workers (then the OS shares them)."""
    if count > len(cores) or not worker.startswith("gw"):
        return None
    return cores[int(worker[2:])::count]


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    cores = affinity.allowed_cores()
    if not worker or not cores:
        return
    share = worker_cores(worker, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), cores)
    if share is None:
        return
    affinity.pin_threads(os.getpid(), set(share))  # every thread: xdist's own and any torch started
    if "torch" in sys.modules:  # imported with the perf plugin, its thread count set from the old mask
        sys.modules["torch"].set_num_threads(len(share))
