"""Argument types and option groups shared by the command groups: each names the bad value and the range."""

from __future__ import annotations

import argparse


def int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi}")
        return value
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (lo < value if lo_open else lo <= value) or not value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {'(' if lo_open else '['}{lo}, {hi}]")
        return value
    return parse


def int_list_in(lo: int, hi: int):
    """'1' or '1,10,100' -> integers, each within lo..hi."""
    def parse(text: str) -> list[int]:
        one = int_in(lo, hi)
        values = [one(x.strip()) for x in text.split(",")]
        return list(dict.fromkeys(values))
    return parse


def name_list(what: str):
    """'a,b' -> ['a', 'b']; an empty list (',' or '') is an error, never 'all'."""
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"{text!r} names no {what}: give at least one, comma-separated")
        return names
    return parse


def parse_ks(text: str) -> tuple[int, ...]:
    """'6', '2,4,6' or '2-8' -> K values (1..64)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give K as 6, a list 2,4,6 or a range 2-8") from None
    if not out or any(not 1 <= k <= 64 for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every K must be within 1..64")
    return tuple(dict.fromkeys(out))



def sandbox_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-code-execution", action="store_true",
                   help="run untrusted code (in the sandbox); or set HARNESS_ALLOW_CODE_EXECUTION=1")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "unshare", "none"),
                   help="containment backend (default: $HARNESS_SANDBOX, else the strongest that works)")

