"""`python -m harness history show`: the run history's series, oldest first (harness/history/store.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.core.errors import BadInputError
from harness.history import store

DEFAULT = Path("results/history.sqlite")


def add_parser(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("history", help="the run history: every bench run's and perf gate run's measurements")
    hsub = h.add_subparsers(dest="history_command", required=True)
    show = hsub.add_parser("show", help="the measurements per series, oldest first, with commit and date")
    show.add_argument("--history", type=Path, default=None, metavar="PATH",
                      help=f"the history file (default: ${store.ENV} if set, else {DEFAULT})")
    show.add_argument("--combination", metavar="ID", help="one series: a perf combination id or bench:... name")
    show.add_argument("--metric", metavar="NAME", help="one metric, e.g. plain_tokens_per_sec")
    show.add_argument("--platform", metavar="ID", help="one platform id")


def run(args: argparse.Namespace) -> int:
    path = args.history or store.default_path() or DEFAULT
    if not path.is_file():
        raise BadInputError(f"--history {path}: no history there yet; `make bench` or `make perf-ab` start one")
    with store.Store(path) as s:
        points = s.series(combination=args.combination, metric=args.metric, platform_id=args.platform)
    if not points:
        print(f"{path}: no measurements match")
        return 0
    series: dict[tuple[str, str, str], list[store.Point]] = {}
    for p in points:
        series.setdefault((p.measurement.combination, p.measurement.metric, p.platform_id), []).append(p)
    for (combination, metric, platform_id), items in series.items():
        print(f"{combination}  {metric}  on {platform_id}")
        for p in items:
            m = p.measurement
            interval = f"[{m.low:.4g}, {m.high:.4g}]" if m.low is not None and m.high is not None else ""
            commit = (p.commit or "-")[:12] + ("+dirty" if p.dirty else "")
            print(f"  {p.date}  {commit:<18} {p.kind:<11} {m.median:>9.4g} {interval:<20} n={m.n:<3} "
                  f"{m.verdict or ''}".rstrip())
    return 0
