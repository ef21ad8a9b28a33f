"""A perf session's results as history runs (harness/history/store.py): one run per gate kind.

Per combination and metric: the median of this tree's rounds, a 95% interval of their geometric
mean (Student's t on the logs), the number of rounds and the metric's verdict."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from harness.machine.provenance import Provenance
from harness.history.store import Measurement, Run
from harness.perf.errorrates import geometric_interval
from harness.perf.record import METRICS, CombinationResult

KIND = {"stored": "perf-stored", "ab": "perf-ab", "update": "perf-update"}


def measurements(result: CombinationResult) -> list[Measurement]:
    out = []
    for metric in METRICS:
        values = result.metric(metric)
        if not values:  # deferred: nothing measured
            continue
        low, high = geometric_interval(values) or (None, None)
        verdict = result.decisions.get(metric, {}).get("verdict", result.verdict.value)
        out.append(Measurement(result.combination, metric, statistics.median(values), low, high, len(values),
                               str(verdict)))
    return out


def runs(results: Sequence[CombinationResult], origin: Provenance) -> list[Run]:
    """One run per gate kind of the session (a session may gate some combinations A/B, others stored)."""
    by_kind: dict[str, list[CombinationResult]] = {}
    for r in results:
        by_kind.setdefault(KIND[r.gate], []).append(r)
    return [Run(kind, origin, tuple(m for r in group for m in measurements(r)),
                label=" ".join(sorted({r.ab.base for r in group if r.ab})))
            for kind, group in by_kind.items()]
