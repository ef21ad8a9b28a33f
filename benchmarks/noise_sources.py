"""Where a gate's round-to-round noise comes from, from the rows ab_power.py kept.

For each A/A gate of a JSON-lines file (benchmarks/data/ab_power_*.jsonl), per metric:
- the per-round sd of ln(candidate / base) of the wall time and of the CPU time the arms used: if
  CPU time is much steadier, the arms were descheduled (time slices taken), else they ran slower;
- the arms' CPU time as a share of their wall time;
- the lag-1 autocorrelation of ln(arm on the first core / arm on the second) and of
  ln(candidate / base): the arms swap cores every round, so a slow core makes the first alternate
  (negative autocorrelation of the ratio) and a slow process makes the second persist.

    python benchmarks/noise_sources.py benchmarks/data/ab_power_avx512-bf16_duet_vm-busy.jsonl
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def lag1(x: list[float]) -> float:
    m = statistics.fmean(x)
    v = sum((a - m) ** 2 for a in x)
    return sum((x[i] - m) * (x[i + 1] - m) for i in range(len(x) - 1)) / v if v else 0.0


def describe(gate: dict) -> str:
    wb, wc = gate["wall_s"]["base"], gate["wall_s"]["candidate"]
    cb, cc = gate["cpu_s"]["base"], gate["cpu_s"]["candidate"]
    wall = [math.log(c / b) for b, c in zip(wb, wc)]
    cpu = [math.log(c / b) for b, c in zip(cb, cc)]
    share = statistics.fmean(c / w for c, w in zip(cb + cc, wb + wc))
    first = gate["cores"]["base"][0]
    plain_b, plain_c = gate["arms"]["base"]["plain_tokens_per_sec"], gate["arms"]["candidate"]["plain_tokens_per_sec"]
    cores = [math.log(b / c) if core == first else math.log(c / b)
             for b, c, core in zip(plain_b, plain_c, gate["cores"]["base"])]
    ratio = [math.log(c / b) for b, c in zip(plain_b, plain_c)]
    return (f"{gate['condition']:>14} {gate['outcome']:>10} {len(wall):>3} rounds: round time sd wall {statistics.stdev(wall):.1%}"
            f", CPU {statistics.stdev(cpu):.1%}; CPU share {share:.2f}; plain lag-1: core/core {lag1(cores):+.2f},"
            f" candidate/base {lag1(ratio):+.2f}")


def main(paths: list[str]) -> int:
    for path in paths:
        for line in Path(path).read_text().splitlines():
            gate = json.loads(line)
            if gate["level"] == 0 and "cpu_s" in gate and gate.get("cores"):
                print(describe(gate))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
