"""What every `python -m harness history` subcommand that reads the history shares: the --history
option and where it points, the series filters (--combination, --metric, --platform) and the series
they select (harness/history/series.py). harness/cli/history.py and history_export.py both take them
from here."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.core.errors import BadInputError, did_you_mean
from harness.history import series as hseries
from harness.history import store

DEFAULT = Path("results/history.sqlite")


def history_option(parser: argparse.ArgumentParser, **kwargs) -> None:
    parser.add_argument("--history", type=store.location, default=None, metavar="PATH_OR_URL",
                        help=f"the history: an SQLite file or a postgresql:// URL (default: ${store.ENV} if set, "
                             f"else {DEFAULT})", **kwargs)


def filter_options(parser: argparse.ArgumentParser) -> None:
    """--history and the series filters that every reading subcommand takes."""
    history_option(parser)
    parser.add_argument("--combination", metavar="ID", help="one series: a perf combination id or bench:... name")
    parser.add_argument("--metric", metavar="NAME", help="one metric, e.g. plain_tokens_per_sec")
    parser.add_argument("--platform", metavar="ID", help="one platform id")


def where(args: argparse.Namespace) -> str | Path:
    """The history a command writes to: --history, else $HARNESS_HISTORY, else the default file."""
    return args.history or store.default_path() or DEFAULT


def existing(args: argparse.Namespace) -> str | Path:
    """The history a command reads: as `where`, and it must exist."""
    found = where(args)
    if not store.exists(found):
        raise BadInputError(f"--history {found}: no history there yet; `make bench` or `make perf-ab` start one")
    return found


def filters(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The filters given, as (option, value)."""
    return tuple((f"--{name}", value) for name in ("combination", "metric", "platform")
                 if (value := getattr(args, name)) is not None)


def _check_filters(s: store.Store, args: argparse.Namespace) -> None:
    """A filter that names nothing in the history: one line with the closest name."""
    for option, column, value in (("--combination", "combination", args.combination),
                                  ("--metric", "metric", args.metric), ("--platform", "platform_id", args.platform)):
        if value is not None:
            known = s.names(column)
            if value not in known:
                raise BadInputError(f"{option} {value}: not in the history {s.name}.{did_you_mean(value, known)} "
                                    f"It holds {len(known)}: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}")


def read_series(s: store.Store, args: argparse.Namespace, *, needed: str = "") -> dict[hseries.SeriesKey,
                                                                                        list[store.Point]]:
    """The open history's points per (combination, metric, platform), oldest first, as the filters
    select them. `needed`: what the command does with them; none is then an error."""
    _check_filters(s, args)
    series = hseries.group(s.series(combination=args.combination, metric=args.metric, platform_id=args.platform))
    if needed and not series:
        given = " ".join(f"{k} {v}" for k, v in filters(args))
        raise BadInputError(f"--history {s.name}: " + (f"no measurements match {given}" if given else
                                                       f"no measurements in it yet; nothing to {needed}"))
    return series
