"""Which statistic of a phase's passes a round should report: the A/A spread of each.

Reads the results.json of A/B gates run with unchanged code (A/A), each round carrying its phases
(harness/measure/phases.py: per phase the median and the 10th percentile of its passes, and their
total over the calls), and prints, per phase and statistic, the spread (sd) of the per-round
ln(candidate / base): what a gate on that phase would have to see through. The tokens/s metrics
are printed beside them. The kept runs (AMD EPYC Zen 4 VM, avx512-bf16, side by side, 16 rounds,
quiet and under `make noisy-host`):

    python benchmarks/phase_spread.py benchmarks/data/phase_spread_avx512-bf16_duet_quiet.json \\
        benchmarks/data/phase_spread_avx512-bf16_duet_noisy.json

They were measured with (the second under benchmarks/noisy_host.py --duty 0.3 --burst-ms 200 --):

    python -m pytest tests/perf -m "perf and not slow" --perf-pair qwen-coder-1.5b+0.5b --perf-against HEAD \\
        --perf-repeats 16 --perf-max-repeats 16 --benchmark-disable --perf-report-dir DIR

With --shift each sd has the mean ln(candidate / base) beside it: what a gate with a planted slowdown
(--perf-plant-slowdown 0.1 --perf-plant-into verify) saw in each phase, on the wall clock and in CPU
time (benchmarks/data/phase_spread_avx2_duet-standin-cpu_noisy*.json). The rows kept and what they chose:
docs/gate-studies.md, "Which statistic each phase is gated by".
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.perf.record import METRICS, ROUND_PHASES  # noqa: E402
from harness.perf.replay import Recording  # noqa: E402

STATISTICS = {"median": lambda c: c.median_ms, "p10": lambda c: c.low_ms, "mean": lambda c: c.total_ms / c.calls}


def spread(pairs: list[tuple[float, float]]) -> float:
    return statistics.stdev(math.log(c / b) for b, c in pairs)


def shift(pairs: list[tuple[float, float]]) -> float:
    return statistics.fmean(math.log(c / b) for b, c in pairs)


def report(path: Path, shifts: bool = False) -> None:
    for gate in Recording.load(path).gates.values():
        if gate.base_rounds is None:
            continue
        rounds = list(zip(gate.base_rounds, gate.rounds))

        def cell(pairs: list[tuple[float, float]]) -> str:
            return f"{spread(pairs):6.2%}" + (f" ({shift(pairs):+6.2%})" if shifts else "")

        print(f"{path.name}: {gate.combination}, {len(rounds)} rounds; sd of ln(candidate/base) per round"
              + (" (its mean)" if shifts else ""))
        for m in METRICS:
            print(f"  {m:24} {cell([(b.metric(m), c.metric(m)) for b, c in rounds])}")
        for phase in ROUND_PHASES:
            both = [(b, c) for b, c in rounds if b.phases and c.phases and phase in b.phases and phase in c.phases]
            if len(both) < 3:
                continue
            cells = "  ".join(f"{name} {cell([(get(b.phases[phase]), get(c.phases[phase])) for b, c in both])}"
                              for name, get in STATISTICS.items())
            print(f"  {phase:24} {cells}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="results.json of A/B gates with phases in their rounds")
    p.add_argument("--shift", action="store_true",
                   help="print each mean ln(candidate/base) beside its sd (a gate with a planted slowdown)")
    args = p.parse_args(argv)
    for path in args.results:
        report(path, args.shift)
    return 0


if __name__ == "__main__":
    sys.exit(main())
