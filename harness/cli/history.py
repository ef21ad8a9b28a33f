"""`python -m harness history show | changes`: the run history's series, oldest first (harness/history/store.py),
and the change points in them (harness/history/changes.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import float_in, int_in
from harness.core.errors import BadInputError
from harness.history import changes as chg
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
    changes = hsub.add_parser("changes", help="change points per series (E-Divisive means with a t-test, as Apache "
                                              "Otava finds them) and the commit range each lies in")
    for name, kwargs in (("--history", dict(type=Path, default=None, metavar="PATH")),
                         ("--combination", dict(metavar="ID")), ("--metric", dict(metavar="NAME")),
                         ("--platform", dict(metavar="ID"))):
        changes.add_argument(name, **kwargs)
    changes.add_argument("--since", metavar="REV",
                         help="exit 1 when a regression lies after REV (in `git rev-list REV..HEAD`): for CI")
    changes.add_argument("--max-pvalue", type=float_in(0.0, 1.0, lo_open=True), default=chg.MAX_PVALUE,
                         help=f"a change point's t-test p-value must be below this (default {chg.MAX_PVALUE})")
    changes.add_argument("--min-magnitude", type=float_in(0.0, 10.0), default=chg.MIN_MAGNITUDE,
                         help="and its relative change at least this, e.g. 0.02 (default 0: any size)")
    changes.add_argument("--window", type=int_in(2 * chg.MIN_SIZE, 100000), default=chg.WINDOW,
                         help=f"points per E-Divisive window (default {chg.WINDOW})")


def _series(args: argparse.Namespace) -> tuple[Path, dict[tuple[str, str, str], list[store.Point]]]:
    """The history's points, per (combination, metric, platform), oldest first."""
    path = args.history or store.default_path() or DEFAULT
    if not path.is_file():
        raise BadInputError(f"--history {path}: no history there yet; `make bench` or `make perf-ab` start one")
    with store.Store(path) as s:
        points = s.series(combination=args.combination, metric=args.metric, platform_id=args.platform)
    series: dict[tuple[str, str, str], list[store.Point]] = {}
    for p in points:
        series.setdefault((p.measurement.combination, p.measurement.metric, p.platform_id), []).append(p)
    return path, series


def run(args: argparse.Namespace) -> int:
    if args.history_command == "changes":
        return run_changes(args)
    path, series = _series(args)
    if not series:
        print(f"{path}: no measurements match")
        return 0
    for (combination, metric, platform_id), items in series.items():
        print(f"{combination}  {metric}  on {platform_id}")
        for p in items:
            m = p.measurement
            interval = f"[{m.low:.4g}, {m.high:.4g}]" if m.low is not None and m.high is not None else ""
            commit = (p.commit or "-")[:12] + ("+dirty" if p.dirty else "")
            print(f"  {p.date}  {commit:<18} {p.kind:<11} {m.median:>9.4g} {interval:<20} n={m.n:<3} "
                  f"{m.verdict or ''}".rstrip())
    return 0


def _commit(p: store.Point) -> str:
    return (p.commit or "-")[:12] + ("+dirty" if p.dirty else "")


def run_changes(args: argparse.Namespace) -> int:
    """Print each series' change points; with --since, exit 1 if a regression lies after REV."""
    path, series = _series(args)
    after = _commits_since(args.since) if args.since else None
    regressions, found = [], 0
    for (combination, metric, platform_id), items in series.items():
        points = chg.change_points([p.measurement.median for p in items], window=args.window,
                                   max_pvalue=args.max_pvalue, min_magnitude=args.min_magnitude)
        if not points:
            continue
        print(f"{combination}  {metric}  on {platform_id}  ({len(items)} points)")
        for c in points:
            before, first = items[c.index - 1], items[c.index]
            worse = chg.is_regression(metric, c)
            in_range = after is not None and first.commit is not None and first.commit in after
            print(f"  {'REGRESSION ' if worse else 'improvement'} {c.mean_before:.4g} -> {c.mean_after:.4g} "
                  f"({c.magnitude:+.1%}, p {c.pvalue:.2g}) between {_commit(before)} ({before.date}) and "
                  f"{_commit(first)} ({first.date})" + ("  [after --since]" if in_range else ""))
            found += 1
            if worse and in_range:
                regressions.append(f"{combination} {metric} {c.magnitude:+.1%} at {_commit(first)}")
    print(f"{path}: {found} change point(s) in {len(series)} series"
          + (f"; {len(regressions)} regression(s) after {args.since}" if args.since else ""))
    return 1 if regressions else 0


def _commits_since(rev: str) -> set[str]:
    """The full shas of REV..HEAD in this repository."""
    import subprocess

    r = subprocess.run(["git", "rev-list", f"{rev}..HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "git failed"
        raise BadInputError(f"--since {rev}: not a revision of this repository ({why})")
    return set(r.stdout.split())
