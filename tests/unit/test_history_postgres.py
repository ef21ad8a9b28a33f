"""The run history on a real PostgreSQL server (tests/unit/pgserver.py starts one from the system's
packages): the same runs and series as the SQLite file, two writer processes at once, the schema's
version, one line for a server that cannot be reached or a lock held too long, and merges between
the two engines that keep each run once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pgserver
from harness.history import store
from harness.history.merge import merge
from harness.history.store import HistoryError
from test_history_store import a_run, append_from_two_processes


@pytest.fixture(scope="module")
def server():
    with pgserver.server() as url:
        yield url


@pytest.fixture
def url(server):
    return pgserver.new_database(server)


def test_runs_are_kept_whole_once_and_read_back_as_in_sqlite(url, tmp_path):
    for where in (url, tmp_path / "h.sqlite"):
        with store.open_store(where) as s:
            late = s.append(a_run("b" * 40, "2026-11-26T10:00:00+00:00", tps=2.7))
            early = s.append(a_run())
            assert late[1] and early[1] and s.append(a_run()) == (early[0], False)
    with store.open_store(url) as pg, store.open_store(tmp_path / "h.sqlite") as lite:
        assert pg.series() == lite.series() and len(pg.series()) == 4
        assert [r.key for r in pg.stored_runs()] == [r.key for r in lite.stored_runs()]
        assert pg.stored_runs()[0].run == a_run()  # provenance and measurements come back equal
        assert pg.names("platform_id") == ["cpu-x-avx2-2c"] and pg.runs() == 2


def test_two_writer_processes_at_once_lose_nothing(url):
    store.open_store(url).close()
    append_from_two_processes(url, shared=True, timeout=180)
    with store.open_store(url) as s:
        assert s.runs() == 120 and len(s.series()) == 240


def test_the_schema_version_is_kept_and_a_newer_one_refused(url):
    import psycopg

    with store.open_store(url) as s:
        assert s._version() == store.SCHEMA_VERSION
    with store.open_store(url) as s:  # opened again: not migrated twice
        assert s.runs() == 0
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("UPDATE history_schema SET version = %s", (store.SCHEMA_VERSION + 1,))
    with pytest.raises(HistoryError, match=f"version {store.SCHEMA_VERSION + 1} is newer than this harness reads"):
        store.open_store(url)


def test_a_server_that_cannot_be_reached_is_one_line_with_host_and_reason(tmp_path):
    url = f"postgresql://harness:s3cret@127.0.0.1:{pgserver.free_port()}/perf"
    with pytest.raises(HistoryError) as err:
        store.open_store(url)
    message = str(err.value)
    assert "cannot connect to PostgreSQL at 127.0.0.1:" in message and "refused" in message
    assert "s3cret" not in message and "\n" not in message
    r = subprocess.run([sys.executable, "-m", "harness", "history", "show", "--history", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 5 and r.stderr.count("\n") == 1 and "cannot connect" in r.stderr, r.stderr


def test_a_lock_held_past_the_timeout_is_one_line_and_writes_nothing(url):
    import psycopg

    store.open_store(url).close()
    with psycopg.connect(url) as holder:  # a transaction that holds the writers' lock
        holder.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
        with store.open_store(url, timeout_s=0.5) as s, pytest.raises(HistoryError, match="locked by another writer"):
            s.append(a_run())
        holder.rollback()
    with store.open_store(url) as s:
        assert s.runs() == 0 and s.append(a_run())[1]


def test_merges_between_sqlite_and_postgresql_keep_each_run_once(url, tmp_path):
    a, b, back = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "back.sqlite"
    with store.open_store(a) as s:
        s.append(a_run())
        s.append(a_run("b" * 40, "2026-11-26T10:00:00+00:00", tps=2.7))
    with store.open_store(b) as s:
        s.append(a_run())  # on both machines
        s.append(a_run("c" * 40, "2026-11-27T10:00:00+00:00", tps=2.6))
    with store.open_store(url) as pg:
        assert [(m.runs, m.new) for m in merge(pg, [a, b], show_progress=False)] == [(2, 2), (2, 1)]
        assert [(m.runs, m.new) for m in merge(pg, [a, b], show_progress=False)] == [(2, 0), (2, 0)]
    with store.open_store(back) as s:
        merge(s, [url], show_progress=False)
        keys = [r.key for r in s.stored_runs()]
    with store.open_store(url) as pg:
        assert keys == [r.key for r in pg.stored_runs()] and len(keys) == 3


def test_the_perf_gate_refuses_an_unreachable_history_before_measuring():
    url = f"postgresql://harness@127.0.0.1:{pgserver.free_port()}/perf"
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/perf", "-m", "perf", "--collect-only", "-q",
                        "--perf-history", url, "-p", "no:cacheprovider"],
                       capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[2])
    assert r.returncode == 4, r.stdout + r.stderr
    assert "--perf-history: " in r.stderr and "cannot connect to PostgreSQL at 127.0.0.1" in r.stderr
