"""`python -m harness history show | changes | plot | report | export | merge`: the run history's series,
oldest first (harness/history/store.py), the change points in them (harness/history/changes.py), their
figures and one HTML page of them (harness/history/plot.py, report.py), and the history in other
tools' formats or merged from several machines (harness/cli/history_export.py); the options and
reading they share are harness/cli/history_series.py's."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import history_export as export_merge
from harness.cli.history_series import existing, filter_options, filters, read_series
from harness.cli.options import float_in, int_in
from harness.core.errors import BadInputError
from harness.history import changes as chg
from harness.history import store
from harness.history import plot as hplot
from harness.history import report as hreport
from harness.history import series as hseries

PLOTS = Path("results/history-plots")
REPORT = Path("results/history.html")


def change_options(parser: argparse.ArgumentParser) -> None:
    """What counts as a change point (harness/history/changes.py)."""
    parser.add_argument("--max-pvalue", type=float_in(0.0, 1.0, lo_open=True), default=chg.MAX_PVALUE,
                        help=f"a change point's p-value must be below this (default {chg.MAX_PVALUE})")
    parser.add_argument("--min-magnitude", type=float_in(0.0, 10.0), default=chg.MIN_MAGNITUDE,
                        help="and its relative change at least this, e.g. 0.02 (default 0: any size)")
    parser.add_argument("--window", type=int_in(2 * chg.MIN_SIZE, 100000), default=chg.WINDOW,
                        help=f"points per E-Divisive window (default {chg.WINDOW})")
    parser.add_argument("--test", choices=chg.TESTS, default=chg.TEST,
                        help=f"the two-sample test of a split: the rank-sum test (mannwhitney) or Welch's t-test "
                             f"as Apache Otava has it (default {chg.TEST})")


def add_parser(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("history", help="the run history: every bench run's and perf gate run's measurements")
    hsub = h.add_subparsers(dest="history_command", required=True)
    show = hsub.add_parser("show", help="the measurements per series, oldest first, with commit and date")
    filter_options(show)
    changes = hsub.add_parser("changes", help="change points per series (E-Divisive means with a rank-sum test, after "
                                              "Apache Otava) and the commit range each lies in")
    filter_options(changes)
    changes.add_argument("--since", metavar="REV",
                         help="exit 1 when a regression lies after REV (in `git rev-list REV..HEAD`): for CI")
    change_options(changes)
    export_merge.add_parsers(hsub)
    _add_plot_report(hsub)


def _add_plot_report(hsub: argparse._SubParsersAction) -> None:
    plot = hsub.add_parser("plot", help="one PNG per series: the medians over runs, intervals, gate verdicts, and "
                                        "each change point with its size and commit range")
    report = hsub.add_parser("report", help="one static HTML page (figures inside it, no network needed) of the "
                                            "trends, change points and latest verdicts, for CI to publish")
    for parser in (plot, report):
        filter_options(parser)
        change_options(parser)
    plot.add_argument("--out", type=Path, default=PLOTS, metavar="DIR", help=f"where the PNGs go (default {PLOTS})")
    report.add_argument("--out", type=Path, default=REPORT, metavar="FILE", help=f"the HTML file (default {REPORT})")


def _series(args: argparse.Namespace, *, needed: str = "") -> tuple[str, dict[hseries.SeriesKey, list[store.Point]]]:
    """(the history's name as messages show it, its series: read_series)."""
    with store.open_store(existing(args)) as s:
        return s.name, read_series(s, args, needed=needed)


def run(args: argparse.Namespace) -> int:
    if args.history_command == "changes":
        return run_changes(args)
    if args.history_command in export_merge.COMMANDS:
        return export_merge.run(args)
    if args.history_command == "plot":
        return run_plot(args)
    if args.history_command == "report":
        return run_report(args)
    path, series = _series(args)
    if not series:
        print(f"{path}: no measurements match")
        return 0
    for (combination, metric, platform_id), items in series.items():
        print(f"{combination}  {metric}  on {platform_id}")
        for p in items:
            m = p.measurement
            interval = f"[{m.low:.4g}, {m.high:.4g}]" if m.low is not None and m.high is not None else ""
            print(f"  {p.date}  {hseries.short_commit(p):<18} {p.kind:<11} {m.median:>9.4g} {interval:<20} n={m.n:<3} "
                  f"{m.verdict or ''}".rstrip())
    return 0


def run_changes(args: argparse.Namespace) -> int:
    """Print each series' change points; with --since, exit 1 if a regression lies after REV."""
    path, series = _series(args)
    after = _commits_since(args.since) if args.since else None
    regressions, found = [], 0
    for s in hseries.analyse(series, _detection(args)):
        if not s.steps:
            continue
        print(f"{s.combination}  {s.metric}  on {s.platform_id}  ({len(s.points)} points)")
        for step in s.steps:
            c, before, first, worse = step.change, step.before, step.after, step.regression
            in_range = after is not None and first.commit is not None and first.commit in after
            print(f"  {step.direction:<11} {c.mean_before:.4g} -> {c.mean_after:.4g} "
                  f"({c.magnitude:+.1%}, p {c.pvalue:.2g}) between {hseries.short_commit(before)} ({before.date}) and "
                  f"{hseries.short_commit(first)} ({first.date})" + ("  [after --since]" if in_range else ""))
            found += 1
            if worse and in_range:
                regressions.append(f"{s.combination} {s.metric} {c.magnitude:+.1%} at {hseries.short_commit(first)}")
    print(f"{path}: {found} change point(s) in {len(series)} series"
          + (f"; {len(regressions)} regression(s) after {args.since}" if args.since else ""))
    return 1 if regressions else 0


def _detection(args: argparse.Namespace) -> hseries.Detection:
    return hseries.Detection(window=args.window, max_pvalue=args.max_pvalue, min_magnitude=args.min_magnitude,
                             test=args.test)


def _analysed(args: argparse.Namespace) -> tuple[str, list[hseries.Series]]:
    """The series with their change points; none is an error, as there is nothing to draw."""
    name, series = _series(args, needed="draw")
    return name, hseries.analyse(series, _detection(args))


def run_plot(args: argparse.Namespace) -> int:
    """One PNG per series; one line per file written."""
    _, series = _analysed(args)
    for path in hplot.write_all(series, args.out):
        print(path)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """The history as one HTML page."""
    name, series = _analysed(args)
    path = hreport.write(args.out, series, hreport.Scope(name, filters(args), _detection(args)))
    print(f"report: {path} ({len(series)} series, {sum(len(s.steps) for s in series)} change point(s))")
    return 0


def _commits_since(rev: str) -> set[str]:
    """The full shas of REV..HEAD in this repository."""
    import subprocess

    r = subprocess.run(["git", "rev-list", f"{rev}..HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "git failed"
        raise BadInputError(f"--since {rev}: not a revision of this repository ({why})")
    return set(r.stdout.split())
