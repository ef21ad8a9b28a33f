"""The run history (harness/history/store.py): runs kept whole and once, read back as series, safe
with two writers at once, versioned; and what the perf gate and bench put into it."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.machine.provenance import Provenance
from harness.history import store
from harness.history.store import HistoryError, Measurement, Run
from harness.perf import to_history
from harness.perf.outcome import Outcome
from harness.perf.record import ABDetail, CombinationResult, Round


def origin(commit: str = "a" * 40, date: str = "2026-11-25T10:00:00+00:00") -> Provenance:
    return Provenance(commit=commit, dirty=False, date=date, platform_id="cpu-x-avx2-2c", cpu_class="avx2",
                      host_probe={"rates": {"memory_gbs": 10.0}}, software={"python": "3.11", "torch": "2.13.0",
                                                                              "transformers": "5", "harness": "0.1"})


def a_run(commit: str = "a" * 40, date: str = "2026-11-25T10:00:00+00:00", tps: float = 3.0) -> Run:
    return Run("perf-ab", origin(commit, date), (
        Measurement("c1", "plain_tokens_per_sec", tps, tps * 0.98, tps * 1.02, 8, "pass"),
        Measurement("c1", "speedup", 3.4, 3.3, 3.5, 8, "pass")), label="reference abc")


def test_a_run_is_kept_whole_once_and_read_back_in_date_order(tmp_path):
    path = tmp_path / "h" / "history.sqlite"
    with store.open_store(path) as s:
        late = s.append(a_run("b" * 40, "2026-11-26T10:00:00+00:00", tps=2.7))
        early = s.append(a_run())
        assert late[1] and early[1]
        assert s.append(a_run()) == (early[0], False)  # the same run again: kept once
        points = s.series(combination="c1", metric="plain_tokens_per_sec")
    assert [p.commit for p in points] == ["a" * 40, "b" * 40]
    assert points[1].measurement == Measurement("c1", "plain_tokens_per_sec", 2.7, 2.7 * 0.98, 2.7 * 1.02, 8, "pass")
    with store.open_store(path) as s:  # reopened: nothing lost, no migration again
        assert s.runs() == 2 and len(s.series()) == 4 and s.series(platform_id="elsewhere") == []


def append_from_two_processes(where, *, shared: bool = False, timeout: float = 120) -> None:
    """Two writer processes that start appending at one instant (so their transactions overlap), 40
    runs each of their own and, with `shared`, 40 runs that both append; each must exit 0."""
    start = time.time() + 8
    writer = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from harness.history import store
        from test_history_store import a_run
        with store.open_store({str(where)!r}) as s:
            time.sleep(max(0.0, {start} - time.time()))
            for i in range(40):
                s.append(a_run(commit=(sys.argv[1] + f"{{i:02d}}").ljust(40, "0"), tps=1 + i))
                if {shared}:
                    s.append(a_run(commit=f"shared{{i:02d}}".ljust(40, "0")))  # the same run from both: kept once
    """)
    procs = [subprocess.Popen([sys.executable, "-c", writer, tag], stderr=subprocess.PIPE, text=True)
             for tag in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err


def test_two_writers_at_once_lose_nothing(tmp_path):
    path = tmp_path / "history.sqlite"
    store.open_store(path).close()
    append_from_two_processes(path)
    with store.open_store(path) as s:
        assert s.runs() == 80 and len(s.series()) == 160


def test_a_file_that_is_not_a_history_is_one_line(tmp_path):
    junk = tmp_path / "results.json"
    junk.write_text('{"not": "sqlite"}' * 100)
    with pytest.raises(HistoryError, match=f"{junk}: not a history file"):
        store.open_store(junk)
    with pytest.raises(HistoryError, match="not a file"):
        store.open_store(tmp_path)
    assert junk.read_text().startswith('{"not"')  # nothing written into it


def test_a_newer_history_is_refused_and_an_empty_one_migrated(tmp_path):
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 1}")
    with pytest.raises(HistoryError, match="newer than this harness reads"):
        store.open_store(newer)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with store.open_store(empty) as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
        assert s.append(a_run())[1]


def test_a_run_of_an_unknown_kind_is_refused(tmp_path):
    with store.open_store(tmp_path / "h.sqlite") as s, pytest.raises(HistoryError, match="run kind 'nightly'"):
        s.append(dataclasses.replace(a_run(), kind="nightly"))
    with store.open_store(tmp_path / "h.sqlite") as s:
        assert s.runs() == 0


def rounds(plain: list[float]) -> list[Round]:
    return [Round(plain_tokens_per_sec=p, assisted_tokens_per_sec=3 * p, speedup=3.0, counters={}) for p in plain]


def test_a_perf_session_becomes_one_run_per_gate_kind():
    ab = CombinationResult("c1", "p", "ab", Outcome.PASS, rounds([3.0, 3.1, 2.9, 3.0]),
                           decisions={"plain_tokens_per_sec": {"verdict": Outcome.PASS}},
                           ab=ABDetail("reference abc", "working tree def", "duet", rounds([3.0] * 4), {}, 0, 0, []))
    stored = CombinationResult("c2", "p", "stored", Outcome.UNDECIDED, rounds([5.0, 5.5]))
    deferred = CombinationResult("c3", "p", "stored", Outcome.DEFERRED, [])
    runs = {r.kind: r for r in to_history.runs([ab, stored, deferred], origin())}
    assert set(runs) == {"perf-ab", "perf-stored"} and runs["perf-ab"].label == "reference abc"
    plain = next(m for m in runs["perf-ab"].measurements if m.metric == "plain_tokens_per_sec")
    assert plain.median == 3.0 and plain.n == 4 and plain.verdict == "pass" and plain.low < 3.0 < plain.high
    assert {m.combination for m in runs["perf-stored"].measurements} == {"c2"}  # the deferred one measured nothing
    assert {m.verdict for m in runs["perf-stored"].measurements} == {"undecided"}


def test_history_show_prints_each_series_oldest_first(tmp_path):
    path = tmp_path / "history.sqlite"
    with store.open_store(path) as s:
        s.append(a_run("b" * 40, "2026-11-26T10:00:00+00:00", tps=2.7))
        s.append(a_run())
    r = subprocess.run([sys.executable, "-m", "harness", "history", "show", "--history", str(path), "--metric",
                        "plain_tokens_per_sec"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "c1  plain_tokens_per_sec  on cpu-x-avx2-2c"
    assert lines[1].split()[:5] == ["2026-11-25T10:00:00+00:00", "a" * 12, "perf-ab", "3", "[2.94,"]
    assert lines[2].split()[1] == "b" * 12 and len(lines) == 3
    missing = subprocess.run([sys.executable, "-m", "harness", "history", "show", "--history", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no history there yet" in missing.stderr


def test_both_engines_migrate_to_the_one_schema_version():
    from harness.history.postgres_store import PostgresStore
    from harness.history.sqlite_store import SQLiteStore

    assert len(SQLiteStore.MIGRATIONS) == len(PostgresStore.MIGRATIONS) == store.SCHEMA_VERSION


def test_a_damaged_history_is_one_line_and_left_as_it_was(tmp_path):
    path = tmp_path / "history.sqlite"
    with store.open_store(path) as s:
        for i in range(200):
            s.append(a_run(commit=f"{i:040d}", tps=1 + i))
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[4096 * 2:4096 * 4] = b"\xff" * 8192  # pages of the tables overwritten, the header intact
    path.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "harness", "history", "show", "--history", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 5 and r.stderr.count("\n") == 1, r.stderr
    assert "not a history file, or a damaged one" in r.stderr and "restore it from a copy" in r.stderr
    assert path.read_bytes() == bytes(data)
