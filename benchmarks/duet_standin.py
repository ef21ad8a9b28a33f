"""Does the stand-in (harness/perf/ab/standin.py) keep an arm from running alone at the end of a round,
and what does that change? One side-by-side gate of a fixed number of rounds in which the stand-in
covers the first arm to finish in rounds 0-1, 4-5, 8-9, ... and not in rounds 2-3, 6-7, ...: both
settings meet the same hour of the host and the same worker pairs, and each has rounds of both
orders (even rounds run plain decoding first, odd rounds assisted first: harness/measure/interleave.py).
With --level the candidate's target forward is that much slower (a planted slowdown; A/A without).
Appends the gate's row (benchmarks/ab_power.py's row, plus `standin`) to --out, then
prints, per setting and round order, the mean ln(candidate/base) of each metric and gated phase.

    python benchmarks/duet_standin.py --level 0.1 --rounds 16 --out benchmarks/data/duet_standin_amx.jsonl
    python benchmarks/duet_standin.py --out benchmarks/data/duet_standin_amx.jsonl --show   # the kept rows

What the kept rows showed: docs/gate-studies.md, "The stand-in".
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

import ab_power
from harness.perf.ab import duet
from harness.perf.ab.gate import ABGate

ORDERS = ("plain first", "assisted first")  # even rounds, odd rounds


def covered(index: int) -> bool:
    """The stand-in covers round `index`: rounds 0-1, 4-5, 8-9, ..."""
    return index % 4 < 2


class HalfCovered(ABGate):
    def covers(self, index: int) -> bool:
        return covered(index)


def means(row: dict) -> dict[tuple[str, str], dict[str, tuple[float, int]]]:
    """Per (setting, order), per metric: (mean ln(candidate/base), rounds)."""
    out: dict[tuple[str, str], dict[str, tuple[float, int]]] = {}
    for setting in ("stand-in", "alone"):
        for parity, order in enumerate(ORDERS):
            cell = out[(setting, order)] = {}
            for m, ratios in row["ratios"].items():
                logs = [math.log(v) for i, v in enumerate(ratios)
                        if i % 2 == parity and covered(i) == (setting == "stand-in")]
                cell[m] = (statistics.fmean(logs) if logs else math.nan, len(logs))
    return out


def show(row: dict) -> None:
    table = means(row)
    kind = f"target forward {100 * row['level']:g}% slower in the candidate" if row.get("level") else "A/A"
    swap = f"exchanging cores every {row['swap_s']:g} s" if row.get("swap_s") else "swapping cores between rounds"
    print(f"{row['combination']}, {row['cpu_class']}, {row['condition']}, {swap}: {row['rounds']} {kind} rounds, "
          f"{row['minutes']:.1f} min; mean ln(candidate/base) by whether the stand-in covered the first arm to "
          "finish, and by the round's order")
    cells = list(table)
    print(f"  {'metric':24} " + "  ".join(f"{s + ', ' + o:>26}" for s, o in cells))
    for m in table[cells[0]]:
        print(f"  {m:24} " + "  ".join(f"{100 * table[c][m][0]:+21.1f}% ({table[c][m][1]:2d})" for c in cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="qwen-coder-1.5b+0.5b")
    p.add_argument("--swap", type=float, default=duet.SWAP_S, metavar="SECONDS",
                   help=f"exchange cores within a round every SECONDS (0: between rounds only; default {duet.SWAP_S})")
    ab_power.study_arguments(p, rounds=16, multiple=4)
    args = p.parse_args(argv)
    ab_power.check_study_arguments(p, args)
    if not args.show:
        try:
            plan = duet.plan("on", swap_s=args.swap)
        except duet.DuetError as exc:
            p.error(str(exc).replace(duet.SWAP_OPTION, "--swap"))
        row = ab_power.study_gate(args.pair, args.rounds, args.level, plan, HalfCovered)
        row["standin"] = "the stand-in covered the first arm to finish in rounds i with i % 4 < 2"
    for kept in ab_power.kept_rows(args.out, None if args.show else row):
        show(kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
