"""Where the stored gate measures (harness/perf/stored/placement.py): --perf-threads resolved once;
`one` holds torch to one thread and every thread of the process to one core for the block, and puts
back what was there; a baseline of the other setting is refused (verdict.check_placement)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from harness.perf.stored import placement
from harness.perf.stored.verdict import BaselineMismatchError, check_placement


def affinities() -> dict[int, set[int]]:
    out = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out[int(task.name)] = os.sched_getaffinity(int(task.name))
        except ProcessLookupError:
            continue
    return out


def test_one_takes_the_first_allowed_core_and_says_so():
    p = placement.resolve("one", cores=[3, 5])
    assert (p.threads, p.core) == ("one", 3)
    assert "one thread pinned to core 3" in p.reason
    assert placement.resolve("all").core is None


@pytest.mark.parametrize("choice, cores, message", [
    ("two", [0, 1], "--perf-threads 'two': choose one of one, all"),
    ("one", [], "--perf-threads one: this platform has no CPU affinity to pin to; pass --perf-threads all"),
])
def test_bad_choices_name_the_option(choice, cores, message):
    with pytest.raises(placement.PlacementError) as err:
        placement.resolve(choice, cores=cores)
    assert str(err.value) == message


def test_one_pins_every_thread_and_restores_them():
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1]  # the last: with 2 cores the pinned set differs from the allowed one
    threads_before = torch.get_num_threads()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # a thread started before: pinned too
    other.start()
    try:
        before = affinities()
        with placement.Placement("one", core, "test").applied():
            assert torch.get_num_threads() == 1
            inside = affinities()
            assert inside and all(cores == {core} for cores in inside.values()), inside
            assert inside.get(other.native_id) == {core}
        after = affinities()
    finally:
        stop.set()
        other.join()
    assert torch.get_num_threads() == threads_before
    assert all(after[tid] == before[tid] for tid in before if tid in after), (before, after)


def test_all_leaves_the_process_as_it_is():
    before, threads = affinities(), torch.get_num_threads()
    with placement.resolve("all").applied():
        assert affinities() == before and torch.get_num_threads() == threads


def test_a_baseline_of_the_other_setting_is_refused():
    check_placement("c", "one", {"threads": "one"})
    check_placement("c", "all", {})  # recorded before the option: measured on every core
    with pytest.raises(BaselineMismatchError) as err:
        check_placement("c", "one", {})
    assert str(err.value) == ("c: the baseline was measured with --perf-threads all, this run measures with "
                              "--perf-threads one, so its numbers are of other work. Measure it again: pytest -m perf "
                              "--perf-update-baselines -k 'c', or check with --perf-threads all")
