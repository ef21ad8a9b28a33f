"""The interleave and the warm-up: one home for how arms share a machine fairly.

Every measurement that compares arms (plain vs assisted in bench and the perf gate, planted
slowdown levels in benchmarks/gate_power.py) runs them alternately in one process, in ABBA order:
the arms in order on even rounds, reversed on odd ones. A machine that drifts during the run
(another job starts, the clock steps down) then slows each arm as often first as last, and no
arm is favoured. Before the first measured round each arm runs (warm_up()), so first-call costs
(kernel selection, allocations, lazy imports) stay out of the numbers: briefly on a CPU, and at the
full length on a GPU and for the arms a caller names (the perf gate's assisted mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from harness.workload.decode import DecodeSettings

T = TypeVar("T")

WARMUP_TOKENS = 8


def abba(arms: Sequence[T], round_index: int) -> list[T]:
    """The arms in the order they run in round `round_index` (0-based)."""
    return list(arms) if round_index % 2 == 0 else list(arms)[::-1]


def warmup_settings(settings: DecodeSettings) -> DecodeSettings:
    """A short run of the same kind: WARMUP_TOKENS new tokens (exactly, if the run is fixed-length)."""
    return dataclasses.replace(settings, max_new_tokens=WARMUP_TOKENS,
                               min_new_tokens=min(settings.min_new_tokens, WARMUP_TOKENS))


def warm_up(arms: Sequence[T], run: Callable[[T, Any, DecodeSettings], Any], inputs: Sequence[Any],
            settings: DecodeSettings, *, device: str = "cpu", full: Collection[T] = (), cycles: int = 1) -> None:
    """Run every arm before anything is measured, `run(arm, input, settings)`. On a GPU every input at
    its full length: kernels are chosen per shape on first sight there (in bf16, cuDNN's attention
    builds a plan for every new key length: docs/bench.md, "Checked on a GPU"), so a short warm-up
    leaves those costs in the first measured rounds. On a CPU the arms in `full` do the same and the
    others run once, briefly (warmup_settings()), on the first input. The perf gate puts its assisted
    mode in `full`: its verification passes take up to K+1 tokens, and after a short warm-up the
    first round of a worker spread wider on one class and its host work ran slower on another
    (docs/gate-studies.md, "The first round of a worker"). The bench and the comparison tables
    (benchmarks/combination_table.py, attention_table.py), which run each prompt once per arm, keep
    the short warm-up: a full one would double their assisted runs.

    `cycles`: how many times the whole warm-up runs. A process's allocator goes on growing its heap
    over its first runs, and a run that grows it pays for every page it touches for the first time;
    the perf gate warms up twice, after which its rounds touched no new memory (docs/gate-studies.md,
    "The first round of a worker")."""
    if cycles < 1:
        raise ValueError(f"cycles must be at least 1, got {cycles}")
    short = warmup_settings(settings)
    for _ in range(cycles):
        for i, ids in enumerate(inputs):
            for arm in arms:
                if device != "cpu" or arm in full:
                    run(arm, ids, settings)
                elif i == 0:
                    run(arm, ids, short)
