"""A bench run as a history run: per configuration, the medians over prompts that bench prints."""

from __future__ import annotations

from harness.measure.bench import BenchResult
from harness.machine.provenance import Provenance
from harness.history.store import Measurement, Run

# Summary field -> the metric's name in the history (higher is better for each but none)
METRICS = {"median_tokens_per_sec": "tokens_per_sec", "median_speedup": "speedup",
           "acceptance_rate": "acceptance_rate", "mean_accepted_length": "mean_accepted_length",
           "median_speedup_vs_reference": "speedup_vs_reference"}


def series_name(result: BenchResult, configuration: str) -> str:
    """The combination a bench configuration is stored under: bench:<pair>:<precisions>:<task>:<configuration>."""
    sel = result.config.selection
    precisions = sel.precisions if sel.draft else f"{sel.precisions}+{sel.mode}"
    return f"bench:{sel.pair}:{precisions}:{sel.task}:{configuration}"


def run(result: BenchResult, origin: Provenance) -> Run:
    measurements = []
    for s in result.summary:
        for field, metric in METRICS.items():
            value = getattr(s, field)
            if value is not None:
                measurements.append(Measurement(series_name(result, s.configuration), metric, float(value),
                                                None, None, s.prompts, None))
    return Run("bench", origin, tuple(measurements))
