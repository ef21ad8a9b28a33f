"""Results files: validated on write and on read, atomic, and bad files give clear errors."""

from __future__ import annotations

import json

import pytest

from harness.core.errors import ResultsError
from harness.core.jsonio import atomic_write_text
from harness.measure.report import read_json, write_json
from tiny_models import write_local_matrix


@pytest.fixture(scope="module")
def results_doc(tmp_path_factory):
    from harness.measure import bench, report
    from harness.workload.registry import load_matrix
    from harness.workload.selection import Request

    matrix = load_matrix(write_local_matrix(tmp_path_factory.mktemp("tiny")))
    cfg = bench.build_config(matrix, Request(pair="tiny+draft", max_new_tokens=8), limit=2)
    return report.to_json(bench.run_bench(cfg, progress=False), ["test"])


def test_round_trip(results_doc, tmp_path):
    path = tmp_path / "out.json"
    write_json(results_doc, path)
    assert read_json(path)["rows"] == json.loads(json.dumps(results_doc["rows"]))


def test_invalid_results_are_not_written(results_doc, tmp_path):
    path = tmp_path / "out.json"
    path.write_text("previous")
    bad = json.loads(json.dumps(results_doc))
    bad["rows"][0]["tokens_per_sec"] = -1.0
    with pytest.raises(ResultsError, match="rows/0/tokens_per_sec"):
        write_json(bad, path)
    bad["rows"][0]["tokens_per_sec"] = float("nan")
    with pytest.raises(ResultsError):
        write_json(bad, path)
    assert path.read_text() == "previous"  # untouched


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty"),
    ('{"schema_version": 1, "x": 1e400}', "x: number out of range"),
    ('{"schema_version": 1, "rows": [', "not valid JSON"),
    ('{"schema_version": 1, "schema_version": 1}', "duplicate key 'schema_version'"),
    ('{"schema_version": 1, "x": NaN}', "NaN is not valid JSON"),
    ('{"schema_version": 99}', "schema_version 99 is newer than this harness reads"),
    ('{"schema_version": 1}', "(top level): 'harness_version' is a required property"),
])
def test_bad_results_files_name_the_file_and_problem(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ResultsError) as exc:
        read_json(path)
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_writes_get_the_mode_a_plain_open_gives(tmp_path):
    """A report or figure that CI publishes must be readable by others: mkstemp alone makes it 0600."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "r.html", "<p>")
        assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o644
    finally:
        os.umask(old)
