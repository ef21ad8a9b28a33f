"""Does exchanging the arms' cores within a round steady the A/B gate, and how often? One A/A gate of a
fixed number of rounds, side by side, in which the even rounds swap cores between rounds only
(`--perf-duet-swap 0`), or every --even-swap seconds, and the odd rounds exchange them every --swap
seconds: both settings meet the same hour of the host, and the same worker pairs (restarted every 4
rounds). With --even-base-first the even rounds move the base arm first at every exchange (the gate
alternates the first mover), to measure the lean a fixed order gives the arm moved second; with
--level the candidate's target forward is that much slower in every round (an A/B gate of a planted
slowdown instead of A/A). Appends the gate's row (benchmarks/ab_power.py's row, plus `swap_s`,
`even_swap_s`, `even_base_first` and `alternating`) to --out, then prints per metric and gated phase
the per-round spread (sd) and mean of ln(candidate/base) under each setting.

    python benchmarks/duet_swap.py --swap 0.25 --rounds 32 --out benchmarks/data/duet_swap_avx2.jsonl
    python benchmarks/noisy_host.py --duty 0.3 --burst-ms 200 -- python benchmarks/duet_swap.py --swap 0.05 --even-swap 0.25 --rounds 32 --out benchmarks/data/duet_swap_avx512-bf16.jsonl
    python benchmarks/duet_swap.py --swap 0.05 --even-swap 0.05 --even-base-first --rounds 64 --out benchmarks/data/duet_swap_amx.jsonl
    python benchmarks/duet_swap.py --swap 0.05 --even-swap 0.05 --even-base-first --level 0.1 --rounds 16 --out benchmarks/data/duet_swap_amx.jsonl
    python benchmarks/duet_swap.py --out benchmarks/data/duet_swap_avx2.jsonl --show   # the kept rows

What the kept rows showed: docs/gate-studies.md, "Exchanging cores within a round" and "Which arm moves first".
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

import ab_power
from harness.perf.ab import duet
from harness.perf.ab.gate import ABGate


class BaseFirst(duet.Swapping):
    """An exchange that moves the base arm (the first pid) first every time."""

    def moves(self, n: int) -> list[tuple[int, int]]:
        return [(pid, self.cores[(i + n) % 2]) for i, pid in enumerate(self.pids)]


def alternating(even: duet.Plan, odd: duet.Plan, even_base_first: bool = False) -> type[ABGate]:
    """An ABGate whose even rounds run under plan `even` (moving the base first at every exchange
    with `even_base_first`) and whose odd rounds under plan `odd`."""
    class Alternating(ABGate):
        plans = (even, odd)
        swapping_classes = (BaseFirst if even_base_first else duet.Swapping, duet.Swapping)

        def _side_by_side(self, index):
            self.plan, self.swapping_class = self.plans[index % 2], self.swapping_classes[index % 2]
            return super()._side_by_side(index)

    return Alternating


def setting_names(row: dict) -> tuple[str, str]:
    """The even rounds' setting and the odd rounds'."""
    even = row.get("even_swap_s") or 0
    names = [f"every {even:g} s" if even else "between rounds", f"every {row['swap_s']:g} s"]
    if row.get("even_base_first"):
        names = [names[0] + ", base first", names[1] + ", alternating"]
    return names[0], names[1]


def spreads(row: dict) -> dict[str, dict[str, tuple[float, float]]]:
    """Per setting, per metric: (sd, mean) of the per-round ln(candidate/base)."""
    out = {}
    for parity, name in enumerate(setting_names(row)):
        out[name] = {}
        for m, ratios in row["ratios"].items():
            logs = [math.log(v) for i, v in enumerate(ratios) if i % 2 == parity]
            out[name][m] = (statistics.stdev(logs), statistics.fmean(logs))
    return out


def show(row: dict) -> None:
    table = spreads(row)
    names = list(table)
    kind = f"target forward {100 * row['level']:g}% slower in the candidate" if row.get("level") else "A/A"
    print(f"{row['combination']}, {row['cpu_class']}, {row['condition']}: {row['rounds']} {kind} rounds, "
          f"{row['minutes']:.1f} min; per-round sd (mean) of ln(candidate/base)")
    print(f"  {'metric':24} " + "  ".join(f"{n:>20}" for n in names))
    for m in table[names[0]]:
        print(f"  {m:24} " + "  ".join(f"{100 * table[n][m][0]:10.2f}% ({100 * table[n][m][1]:+5.1f}%)" for n in names))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="qwen-coder-1.5b+0.5b")
    p.add_argument("--swap", type=float, default=duet.SWAP_S, metavar="SECONDS", help="the odd rounds' period")
    p.add_argument("--even-swap", type=float, default=0.0, metavar="SECONDS",
                   help="the even rounds' period (default 0: they swap cores between rounds only)")
    p.add_argument("--even-base-first", action="store_true",
                   help="the even rounds move the base arm first at every exchange (the gate alternates the first mover)")
    ab_power.study_arguments(p, rounds=32, multiple=2)
    args = p.parse_args(argv)
    ab_power.check_study_arguments(p, args)
    if args.even_base_first and not args.even_swap:
        p.error("--even-base-first: the even rounds exchange cores only with --even-swap SECONDS (above 0)")
    if not args.show:
        plans = []  # even rounds, odd rounds
        for flag, period in (("--even-swap", args.even_swap), ("--swap", args.swap)):
            try:
                plans.append(duet.plan("on", swap_s=period))
            except duet.DuetError as exc:
                p.error(str(exc).replace(duet.SWAP_OPTION, flag))
        row = ab_power.study_gate(args.pair, args.rounds, args.level, plans[0],
                                  alternating(*plans, args.even_base_first))
        row.update({"swap_s": args.swap, "even_swap_s": args.even_swap, "even_base_first": args.even_base_first,
                    "alternating": "odd rounds exchange cores every swap_s seconds, even rounds every even_swap_s "
                                   "(0: between rounds only), moving the base first at every exchange where "
                                   "even_base_first"})
    for kept in ab_power.kept_rows(args.out, None if args.show else row):
        show(kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
