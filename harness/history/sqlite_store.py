"""The run history in one SQLite file: write-ahead log, a busy timeout, and each write one
BEGIN IMMEDIATE transaction, so two writers on one machine queue instead of one failing at commit.
The schema version is the file's `PRAGMA user_version`."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from harness.history.store import HistoryError, Store, tables_v1

log = logging.getLogger(__name__)

# "INTEGER PRIMARY KEY" is SQLite's own row id
V1 = tables_v1(key="INTEGER PRIMARY KEY", real="REAL")


class SQLiteStore(Store):
    MIGRATIONS = (V1,)

    def __init__(self, path: Path, *, timeout_s: float):
        path = Path(path)
        if path.exists() and not path.is_file():
            raise HistoryError(f"{path}: not a file; give the path of a history file (.sqlite)")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
            db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise HistoryError(f"{path}: cannot open the history ({exc})") from None
        super().__init__(str(path), db, timeout_s, identity=str(path.resolve()))
        with self._guard():
            if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                log.warning("%s: no write-ahead log on this file system; readers wait for writers", path)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite's errors as one line each: a file that is not a history, or one locked past the timeout."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise HistoryError(f"{self.name}: locked by another writer for over {self.timeout_s:g} s; nothing "
                                   "was written; run again when it has finished") from None
            raise HistoryError(f"{self.name}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.name}: not a history file, or a damaged one ({exc}); restore it from a "
                               "copy (CI's cache, another machine's history: docs/history.md), give another path, or "
                               "move it away") from None

    def _version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _set_version(self, version: int) -> None:
        self.db.execute(f"PRAGMA user_version = {int(version)}")

    @contextlib.contextmanager
    def _write(self, *, schema: bool = False) -> Iterator[None]:
        with self._guard():
            self.db.execute("BEGIN IMMEDIATE")  # the write lock first: writers queue here, not at commit
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
