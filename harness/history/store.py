"""The run history: every run's measurements, kept in one SQLite file, never overwritten.

A run (a bench run, a perf gate session, a baseline update) is appended as one row of `runs` (where
it came from: harness/machine/provenance.py) and its `measurements`: per combination and metric, the
median over the run's rounds, an interval, the number of rounds and the verdict. The same run
appended twice is kept once (its key is a hash of its content), so histories of several machines
merge without doubles.

The file carries its schema version (`PRAGMA user_version`) and is migrated forward on open; a file
of a newer version is refused. Writers on one machine queue on SQLite's own lock (write-ahead log,
a busy timeout, each append one immediate transaction), so two gates may append at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import IntegrityError
from harness.machine.provenance import Provenance

log = logging.getLogger(__name__)

ENV = "HARNESS_HISTORY"  # the default history file of runs that are not given one
KINDS = ("bench", "perf-stored", "perf-ab", "perf-update")
BUSY_TIMEOUT_S = 120.0

# MIGRATIONS[n] takes a file from version n to n + 1.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,           -- sha256 of the run's content: appending twice keeps one
        kind TEXT NOT NULL,
        commit_sha TEXT,                    -- null outside a git checkout
        dirty INTEGER,
        date TEXT NOT NULL,
        platform_id TEXT NOT NULL,
        cpu_class TEXT NOT NULL,
        software TEXT NOT NULL,             -- JSON object of versions
        host_probe TEXT,                    -- JSON, or null where none was taken
        label TEXT NOT NULL DEFAULT ''      -- e.g. the A/B base the run was gated against
    );
    CREATE TABLE measurements (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        combination TEXT NOT NULL,
        metric TEXT NOT NULL,
        median REAL NOT NULL,
        low REAL,
        high REAL,
        n INTEGER NOT NULL,
        verdict TEXT,
        PRIMARY KEY (run_id, combination, metric)
    );
    CREATE INDEX measurements_series ON measurements (combination, metric);
    CREATE INDEX runs_date ON runs (platform_id, date);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(IntegrityError):
    """A history file that cannot be read or written as one."""


@dataclass(frozen=True)
class Measurement:
    """One metric of one combination in one run."""
    combination: str
    metric: str
    median: float
    low: float | None       # an interval around it where the run has one (else None)
    high: float | None
    n: int                  # rounds (or prompts) behind the median
    verdict: str | None     # the gate's word for this metric (harness/perf/outcome.py), None for bench


@dataclass(frozen=True)
class Run:
    kind: str                                  # one of KINDS
    provenance: Provenance
    measurements: tuple[Measurement, ...]
    label: str = ""

    def key(self) -> str:
        doc = {"kind": self.kind, "provenance": self.provenance.as_dict(), "label": self.label,
               "measurements": sorted((asdict(m) for m in self.measurements),
                                      key=lambda m: (m["combination"], m["metric"]))}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, allow_nan=False).encode()).hexdigest()


@dataclass(frozen=True)
class Point:
    """A measurement with the run it belongs to: one point of a series."""
    run_id: int
    kind: str
    commit: str | None
    dirty: bool | None
    date: str
    platform_id: str
    measurement: Measurement


def default_path() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


class Store:
    """One history file, open for reading and appending; use as a context manager."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise HistoryError(f"{self.path}: not a file; give the path of a history file (.sqlite)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"{self.path}: cannot open the history ({exc})") from None
        try:
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except BaseException as exc:
            self.db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise HistoryError(f"{self.path}: not a history file ({exc}); give another path or move it "
                                   "away") from None
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(f"{self.path}: history version {version} is newer than this harness reads "
                               f"({SCHEMA_VERSION}); upgrade the harness")
        if self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
            log.warning("%s: no write-ahead log on this file system; concurrent readers wait for writers", self.path)
        while version < SCHEMA_VERSION:
            with _Immediate(self.db):
                if self.db.execute("PRAGMA user_version").fetchone()[0] != version:  # another process migrated
                    break
                for statement in MIGRATIONS[version].split(";"):  # executescript would commit half-way
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {version + 1}")
            log.info("%s: history migrated to version %d", self.path, version + 1)
            version = self.db.execute("PRAGMA user_version").fetchone()[0]

    def append(self, run: Run) -> tuple[int, bool]:
        """(the run's id, whether it was new): one transaction, so a reader never sees half a run."""
        if run.kind not in KINDS:
            raise HistoryError(f"{self.path}: run kind {run.kind!r} is not one of {', '.join(KINDS)}")
        key, p = run.key(), run.provenance
        with _Immediate(self.db):
            row = self.db.execute("SELECT id FROM runs WHERE key = ?", (key,)).fetchone()
            if row:
                return row[0], False
            cur = self.db.execute(
                "INSERT INTO runs (key, kind, commit_sha, dirty, date, platform_id, cpu_class, software, host_probe,"
                " label) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, run.kind, p.commit, None if p.dirty is None else int(p.dirty), p.date, p.platform_id,
                 p.cpu_class, json.dumps(p.software, sort_keys=True),
                 None if p.host_probe is None else json.dumps(p.host_probe, sort_keys=True), run.label))
            run_id = int(cur.lastrowid)
            self.db.executemany(
                "INSERT INTO measurements (run_id, combination, metric, median, low, high, n, verdict)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, m.combination, m.metric, m.median, m.low, m.high, m.n, m.verdict) for m in run.measurements])
        return run_id, True

    def series(self, *, combination: str | None = None, metric: str | None = None,
               platform_id: str | None = None) -> list[Point]:
        """Every stored measurement matching the filters, oldest first."""
        where, args = [], []
        for column, value in (("m.combination", combination), ("m.metric", metric), ("r.platform_id", platform_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = ("SELECT r.id, r.kind, r.commit_sha, r.dirty, r.date, r.platform_id, m.combination, m.metric, m.median,"
               " m.low, m.high, m.n, m.verdict FROM measurements m JOIN runs r ON r.id = m.run_id"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.date, r.id, m.combination, m.metric")
        return [Point(row[0], row[1], row[2], None if row[3] is None else bool(row[3]), row[4], row[5],
                      Measurement(*row[6:])) for row in self.db.execute(sql, args)]

    def runs(self) -> int:
        return self.db.execute("SELECT count(*) FROM runs").fetchone()[0]


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an error): the write lock is taken at the start, so two
    writers queue instead of one failing at commit."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def append(path: Path, run: Run) -> tuple[int, bool]:
    """Open, append one run, close."""
    with Store(path) as store:
        return store.append(run)

