"""The run history: every run's measurements, kept in one database, never overwritten.

A run (a bench run, a perf gate session, a baseline update) is appended as one row of `runs` (where
it came from: harness/machine/provenance.py) and its `measurements`: per combination and metric, the
median over the run's rounds, an interval, the number of rounds and the verdict. The same run
appended twice is kept once (its key is a hash of its content), so histories of several machines
merge without doubles.

A history is an SQLite file (harness/history/sqlite_store.py), or a PostgreSQL database named by a
`postgresql://` URL (harness/history/postgres_store.py) for teams whose runners share one. Both carry
their schema version and are migrated forward on open; a newer version is refused. Writers queue on
the database's own lock (each append one transaction that takes the write lock first), so two gates
may append at once and a reader never sees half a run; a writer that waits longer than the timeout
stops with one line and writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import IntegrityError
from harness.machine.provenance import Provenance

log = logging.getLogger(__name__)

ENV = "HARNESS_HISTORY"  # the default history file of runs that are not given one
KINDS = ("bench", "perf-stored", "perf-ab", "perf-update")
BUSY_TIMEOUT_S = 120.0

SCHEMA_VERSION = 1  # each engine has this many migrations (tests check)
URL_SCHEMES = ("postgresql://", "postgres://")


def tables_v1(*, key: str, real: str) -> tuple[str, ...]:
    """Version 1 of the tables, in each engine's words for a generated key and a double."""
    int_key = key.split()[0]
    return (
        f"""CREATE TABLE runs (
            id {key},
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
        )""",
        f"""CREATE TABLE measurements (
            run_id {int_key} NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            combination TEXT NOT NULL,
            metric TEXT NOT NULL,
            median {real} NOT NULL,
            low {real},
            high {real},
            n INTEGER NOT NULL,
            verdict TEXT,
            PRIMARY KEY (run_id, combination, metric)
        )""",
        "CREATE INDEX measurements_series ON measurements (combination, metric)",
        "CREATE INDEX runs_date ON runs (platform_id, date)",
    )


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


@dataclass(frozen=True)
class StoredRun:
    """A run as the history holds it, with its key: what merge copies and export writes."""
    key: str
    run: Run


def location(value: str | Path) -> str | Path:
    """A --history value as the store takes it: a URL stays a string (Path would fold its '//')."""
    text = str(value).strip()
    if not text:
        raise ValueError("empty: give a file path or a postgresql:// URL")
    return text if is_url(text) else Path(text)


def is_url(value: str | Path) -> bool:
    return isinstance(value, str) and value.startswith(URL_SCHEMES)


def default_path() -> str | Path | None:
    value = os.environ.get(ENV, "").strip()
    return location(value) if value else None


def exists(where: str | Path) -> bool:
    """Whether there is a history to read: a file, or any database a URL names."""
    return is_url(where) or Path(where).is_file()


def open_store(where: str | Path, *, timeout_s: float = BUSY_TIMEOUT_S) -> "Store":
    """The history at a path (SQLite, created if missing) or a postgresql:// URL, migrated to this version."""
    if is_url(where):
        from harness.history.postgres_store import PostgresStore

        return PostgresStore(str(where), timeout_s=timeout_s)
    from harness.history.sqlite_store import SQLiteStore

    return SQLiteStore(Path(where), timeout_s=timeout_s)


class Store:
    """One history, open for reading and appending; use as a context manager. The SQL here is what
    both engines share (written with '?' parameters); each engine opens its database, holds its
    schema version, and says how a transaction takes the write lock."""

    PARAM = "?"
    MIGRATIONS: tuple[tuple[str, ...], ...] = ()  # MIGRATIONS[n]: the statements from version n to n + 1

    def __init__(self, name: str, db: Any, timeout_s: float, *, identity: str | None = None):
        self.name, self.db, self.timeout_s = name, db, timeout_s
        self.identity = identity or name  # the same for one history however its path is written (merge)
        try:
            with self._guard():
                self._migrate()
        except BaseException:
            self.db.close()
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # -- what each engine provides
    def _version(self) -> int:
        raise NotImplementedError

    def _set_version(self, version: int) -> None:
        raise NotImplementedError

    def _write(self, *, schema: bool = False) -> Any:
        """A context manager: one transaction holding the write lock (the schema's lock with schema=True)."""
        raise NotImplementedError

    def _guard(self) -> Any:
        """A context manager that turns the engine's errors into one-line HistoryErrors."""
        return contextlib.nullcontext()

    # -- shared
    def _sql(self, sql: str) -> str:
        return sql if self.PARAM == "?" else sql.replace("?", self.PARAM)

    def _rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        with self._guard(), contextlib.closing(self.db.cursor()) as cur:
            cur.execute(self._sql(sql), args)
            return list(cur.fetchall())

    def _execute(self, sql: str, args: tuple | list = (), *, many: bool = False) -> None:
        with self._guard(), contextlib.closing(self.db.cursor()) as cur:
            (cur.executemany if many else cur.execute)(self._sql(sql), args)

    def _migrate(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise HistoryError(f"{self.name}: history version {version} is newer than this harness reads "
                               f"({SCHEMA_VERSION}); upgrade the harness")
        while version < SCHEMA_VERSION:
            with self._write(schema=True):
                if self._version() == version:  # else another process migrated it meanwhile
                    for statement in self.MIGRATIONS[version]:
                        self._execute(statement)
                    self._set_version(version + 1)
                    log.info("%s: history migrated to version %d", self.name, version + 1)
            version = self._version()

    def append(self, run: Run, *, key: str | None = None) -> tuple[int, bool]:
        """(the run's id, whether it was new): one transaction, so a reader never sees half a run.
        `key`: the run's key as another history holds it (merge); by default its content's hash."""
        if run.kind not in KINDS:
            raise HistoryError(f"{self.name}: run kind {run.kind!r} is not one of {', '.join(KINDS)}")
        key, p = key or run.key(), run.provenance
        with self._write():
            row = self._rows("SELECT id FROM runs WHERE key = ?", (key,))
            if row:
                return int(row[0][0]), False
            run_id = int(self._rows(
                "INSERT INTO runs (key, kind, commit_sha, dirty, date, platform_id, cpu_class, software, host_probe,"
                " label) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (key, run.kind, p.commit, None if p.dirty is None else int(p.dirty), p.date, p.platform_id,
                 p.cpu_class, json.dumps(p.software, sort_keys=True),
                 None if p.host_probe is None else json.dumps(p.host_probe, sort_keys=True), run.label))[0][0])
            self._execute(
                "INSERT INTO measurements (run_id, combination, metric, median, low, high, n, verdict)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, m.combination, m.metric, m.median, m.low, m.high, m.n, m.verdict) for m in run.measurements],
                many=True)
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
                      Measurement(*row[6:])) for row in self._rows(sql, args)]

    def names(self, column: str) -> list[str]:
        """The distinct combinations, metrics or platforms the history holds (for 'did you mean')."""
        table = {"combination": "measurements", "metric": "measurements", "platform_id": "runs"}[column]
        return [row[0] for row in self._rows(f"SELECT DISTINCT {column} FROM {table} ORDER BY {column}")]

    def runs(self) -> int:
        return int(self._rows("SELECT count(*) FROM runs")[0][0])

    def stored_runs(self) -> list[StoredRun]:
        """Every run whole, with its key, oldest first."""
        measurements: dict[int, list[Measurement]] = {}
        for row in self._rows("SELECT run_id, combination, metric, median, low, high, n, verdict FROM measurements"
                              " ORDER BY run_id, combination, metric"):
            measurements.setdefault(row[0], []).append(Measurement(*row[1:]))
        out = []
        for (run_id, key, kind, commit, dirty, date, platform_id, cpu_class, software, probe, label) in self._rows(
                "SELECT id, key, kind, commit_sha, dirty, date, platform_id, cpu_class, software, host_probe, label"
                " FROM runs ORDER BY date, id"):
            origin = Provenance(commit=commit, dirty=None if dirty is None else bool(dirty), date=date,
                                platform_id=platform_id, cpu_class=cpu_class,
                                host_probe=None if probe is None else json.loads(probe), software=json.loads(software))
            out.append(StoredRun(key, Run(kind, origin, tuple(measurements.get(run_id, ())), label)))
        return out
