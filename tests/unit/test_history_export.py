"""The history handed on: Apache Otava's CSV tests and Bencher Metric Format files that those tools
read as they are, merges that keep each run once, and the one-line errors of `history` (a name not
in the history, a history locked past the timeout)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import sqlite3

import jsonschema
import pytest
import yaml

from harness.cli.main import main
from harness.history import series, store
from harness.history.store import HistoryError, Measurement, Run
from test_history_store import a_run, origin

# Bencher's published JSON schema of its metric format (https://bencher.dev/bmf.json)
BMF_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema", "type": "object",
    "patternProperties": {".+": {"type": "object", "patternProperties": {".+": {
        "type": "object", "required": ["value"],
        "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                       "upper_value": {"type": "number"}}}}}}}


def history(path, runs=6):
    """Runs on two days of commits: a perf series with intervals and a bench series with a time metric."""
    with store.open_store(path) as s:
        for i in range(runs):
            date = f"2026-11-{10 + i:02d}T10:00:00+00:00"
            s.append(a_run(f"{i:x}" * 40, date, tps=3.0 - 0.1 * i))
            s.append(Run("bench", origin(f"{i:x}" * 40, date), (
                Measurement("bench:p:bf16:humaneval:assisted", "prefill_ms", 400.0 + i, None, None, 8, None),)))
    return path


def test_otava_reads_one_csv_test_per_series_as_its_importer_does(tmp_path):
    path = history(tmp_path / "h.sqlite")
    assert main(["history", "export", "otava", "--history", str(path), "--out", str(tmp_path / "o")]) == 0
    config = yaml.safe_load((tmp_path / "o" / "otava.yaml").read_text())["tests"]
    assert len(config) == 3  # c1 plain and speedup, the bench prefill
    directions = {}
    for name, test in config.items():  # what otava's create_csv_test_config and CsvImporter read
        assert test["type"] == "csv" and set(test["attributes"]) == {"commit", "dirty", "kind"}
        with open(tmp_path / "o" / test["file"], newline="") as fh:
            rows = list(csv.reader(fh))
        header, data = rows[0], rows[1:]
        assert test["time_column"] in header and all(a in header for a in test["attributes"])
        (metric, conf), = test["metrics"].items()
        directions[metric] = conf["direction"]
        values = [float(r[header.index(metric)]) for r in data]
        times = [dt.datetime.fromisoformat(r[header.index("time")]) for r in data]
        assert len(values) == 6 and times == sorted(times) and all(len(r) == len(header) for r in data)
        if metric == "plain_tokens_per_sec":
            assert values == pytest.approx([3.0 - 0.1 * i for i in range(6)])
    assert directions == {"plain_tokens_per_sec": 1, "speedup": 1, "prefill_ms": -1}


def test_bencher_gets_one_valid_bmf_file_per_run_and_an_index(tmp_path):
    path = history(tmp_path / "h.sqlite", runs=3)
    assert main(["history", "export", "bencher", "--history", str(path), "--out", str(tmp_path / "b"),
                 "--combination", "c1"]) == 0
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    assert [e["commit"] for e in index] == ["0" * 40, "1" * 40, "2" * 40]  # bench runs filtered out
    assert {e["testbed"] for e in index} == {"cpu-x-avx2-2c"} and {e["kind"] for e in index} == {"perf-ab"}
    for i, entry in enumerate(index):
        doc = json.loads((tmp_path / "b" / entry["file"]).read_text())
        jsonschema.validate(doc, BMF_SCHEMA)
        plain = doc["c1"]["plain_tokens_per_sec"]
        assert plain["value"] == pytest.approx(3.0 - 0.1 * i)
        assert plain["lower_value"] < plain["value"] < plain["upper_value"]


def test_series_slugs_are_file_names_and_unique():
    a = series.slug(("q:bf16+w8:cpu:greedy:k8", "speedup", "cpu-x"))
    b = series.slug(("q:bf16+w8:cpu:greedy/k8", "speedup", "cpu-x"))
    assert a != b and "/" not in b and ":" not in a


def test_merge_keeps_each_run_once_however_often_it_runs(tmp_path, capsys):
    a, b, into = history(tmp_path / "a.sqlite", runs=3), tmp_path / "b.sqlite", tmp_path / "all.sqlite"
    with store.open_store(b) as s:
        s.append(a_run("0" * 40, "2026-11-10T10:00:00+00:00", tps=3.0))  # also in a
        s.append(a_run("f" * 40, "2026-12-01T10:00:00+00:00", tps=2.0))
    assert main(["history", "merge", str(a), str(b), "--history", str(into)]) == 0
    assert "7 run(s) in all" in capsys.readouterr().out
    assert main(["history", "merge", str(b), str(a), "--history", str(into)]) == 0
    out = capsys.readouterr().out
    assert "2 run(s), 0 new" in out and "6 run(s), 0 new" in out and "7 run(s) in all" in out
    with store.open_store(into) as s, store.open_store(a) as one:
        assert {r.key for r in one.stored_runs()} <= {r.key for r in s.stored_runs()}


def test_merge_refuses_a_missing_source_and_itself(tmp_path, capsys):
    a = history(tmp_path / "a.sqlite", runs=1)
    assert main(["history", "merge", str(tmp_path / "nope.sqlite"), "--history", str(a)]) == 2
    assert "nope.sqlite: no history there" in capsys.readouterr().err
    assert main(["history", "merge", str(a), "--history", str(a)]) == 2
    assert "cannot be merged into itself" in capsys.readouterr().err
    assert main(["history", "merge", str(a.parent / "." / a.name), "--history", str(a)]) == 2  # the same file
    assert "cannot be merged into itself" in capsys.readouterr().err


@pytest.mark.parametrize("option, wrong, right", [("--metric", "plain_tokens_per_se", "plain_tokens_per_sec"),
                                                  ("--combination", "c2", "c1"),
                                                  ("--platform", "cpu-x-avx2", "cpu-x-avx2-2c")])
def test_a_name_not_in_the_history_says_the_closest(tmp_path, capsys, option, wrong, right):
    path = history(tmp_path / "h.sqlite", runs=1)
    for command in ("show", "changes"):
        assert main(["history", command, "--history", str(path), option, wrong]) == 2
        err = capsys.readouterr().err
        assert f"{option} {wrong}: not in the history" in err and f"Did you mean {right!r}" in err
        assert err.count("\n") == 1


def test_a_history_locked_past_the_timeout_is_one_line_and_writes_nothing(tmp_path):
    path = history(tmp_path / "h.sqlite", runs=1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer mid-append
    try:
        with store.open_store(path, timeout_s=0.3) as s, pytest.raises(HistoryError) as err:
            s.append(a_run("9" * 40))
        assert "locked by another writer for over 0.3 s; nothing was written" in str(err.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with store.open_store(path) as s:
        assert s.runs() == 2 and s.append(a_run("9" * 40))[1]
