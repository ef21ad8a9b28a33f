"""`python -m harness history export otava|bencher` and `history merge`: the history in Apache Otava's
and Bencher's formats (harness/history/export.py), and histories of several machines merged into one
(harness/history/merge.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.history_series import existing, filter_options, history_option, read_series, where
from harness.core.errors import BadInputError
from harness.history import export, store
from harness.history.merge import merge

COMMANDS = ("export", "merge")
FORMATS = ("otava", "bencher")


def add_parsers(hsub: argparse._SubParsersAction) -> None:
    ex = hsub.add_parser("export", help="the history as Apache Otava CSV files with their otava.yaml, or as "
                                        "Bencher Metric Format JSON per run with an index")
    ex.add_argument("format", choices=FORMATS, help="otava: a CSV per series and otava.yaml; bencher: a BMF JSON "
                                                    "per run and index.json")
    ex.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="the folder to write (default: results/history-otava or results/history-bencher)")
    filter_options(ex)
    mg = hsub.add_parser("merge", help="append every run of other histories (files or URLs) to this one; a run "
                                       "already there is kept once, so merging again changes nothing")
    mg.add_argument("sources", nargs="+", type=store.location, metavar="SOURCE",
                    help="histories to take runs from: SQLite files or postgresql:// URLs")
    history_option(mg)


def run(args: argparse.Namespace) -> int:
    return run_merge(args) if args.history_command == "merge" else run_export(args)


def run_export(args: argparse.Namespace) -> int:
    out = args.out or Path(f"results/history-{args.format}")
    with store.open_store(existing(args)) as s:
        series = read_series(s, args, needed="export")
        runs = s.stored_runs() if args.format == "bencher" else []
    if args.format == "otava":
        written = export.otava(series, out)
        print(f"{written.folder}: {written.files} Otava test(s) ({written.rows} points) and otava.yaml; "
              f"`cd {written.folder} && otava analyze --config-file otava.yaml <test>`")
        return 0
    written = export.bencher(runs, out, set(series))
    print(f"{written.folder}: {written.files} Bencher Metric Format file(s), one per run ({written.rows} "
          "measurements), and index.json; post each with `bencher run --adapter json --file FILE --hash COMMIT "
          "--testbed TESTBED` (docs/history.md)")
    return 0


def run_merge(args: argparse.Namespace) -> int:
    into = where(args)
    for source in args.sources:
        if not store.exists(source):
            raise BadInputError(f"merge {source}: no history there; give an SQLite file or a postgresql:// URL")
    with store.open_store(into) as target:
        merged = merge(target, args.sources)
        for m in merged:
            print(f"{m.source}: {m.runs} run(s), {m.new} new in {target.name}")
        print(f"{target.name}: {target.runs()} run(s) in all")
    return 0
