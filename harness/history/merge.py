"""Histories of several machines (or CI runners) merged into one. A run keeps the key it has in its
source, so merging the same history twice, or two histories that share runs, adds each run once;
one writer per platform therefore merges without conflicts, in any order."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core import progress
from harness.core.errors import BadInputError
from harness.history.store import Store, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Merged:
    source: str     # as messages show it (a URL without its password)
    runs: int
    new: int


def merge(into: Store, sources: Sequence[str | Path], *, show_progress: bool = True) -> list[Merged]:
    """Append every run of each source to `into`, each run one transaction (an interrupted merge
    leaves whole runs only, and running it again completes it)."""
    out = []
    for where in sources:
        with open_store(where) as source:
            if source.identity == into.identity:
                raise BadInputError(f"{source.name}: a history cannot be merged into itself; name another --history")
            runs = source.stored_runs()
            bar = progress.bar(desc=f"merge {source.name}", total=len(runs), unit="run", enabled=show_progress)
            new = 0
            try:
                for stored in runs:
                    new += into.append(stored.run, key=stored.key)[1]
                    bar.update(1)
            finally:
                bar.close()
            log.info("merged %s into %s: %d runs, %d new", source.name, into.name, len(runs), new)
            out.append(Merged(source.name, len(runs), new))
    return out
