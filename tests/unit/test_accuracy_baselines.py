"""baselines/accuracy.json: the committed file reads (schema), names real pairs and precisions, and
writes are validated and atomic."""

from __future__ import annotations

import json

import pytest

import quant
from harness.accuracy import baselines as accuracy_baselines
from harness.workload import models, registry


def test_committed_file_reads_and_names_real_pairs_and_precisions():
    doc = accuracy_baselines.read()
    matrix = registry.load_matrix()
    precisions = {*models.FLOAT_DTYPES, *quant.methods()}
    assert doc["humaneval"], "no HumanEval baseline committed"
    for name, entry in doc["humaneval"].items():
        pair, precs, selection = name.split(":")
        target, draft = precs.split("+")
        matrix.pair(pair)  # raises "Unknown pair" otherwise
        assert {target, draft} <= precisions, name
        assert accuracy_baselines.key(pair, target, draft, selection) == name
        assert set(entry["plain_passed"]) <= set(entry["task_ids"])
        assert entry["plain_pass_at_1"] == pytest.approx(len(entry["plain_passed"]) / len(entry["task_ids"]))
        assert entry["assisted_pass_at_1"] == pytest.approx(len(entry["assisted_passed"]) / len(entry["task_ids"]))


ENTRY = {"task_ids": ["HumanEval/0"], "max_new_tokens": 8, "plain_pass_at_1": 1.0, "assisted_pass_at_1": 1.0,
         "tolerance": 0.0, "plain_passed": ["HumanEval/0"], "assisted_passed": ["HumanEval/0"], "measured": "test"}


def test_write_round_trips_and_a_bad_entry_leaves_the_file_unchanged(tmp_path):
    path = tmp_path / "accuracy.json"
    name = accuracy_baselines.key("qwen-coder-1.5b+0.5b", "bf16", "w8af32-tensor", "full")
    accuracy_baselines.write_entry(name, ENTRY, path)
    assert accuracy_baselines.entry(name, path) == ENTRY
    before = path.read_bytes()
    with pytest.raises(accuracy_baselines.AccuracyBaselineError, match="tolerance"):
        accuracy_baselines.write_entry(name, {**ENTRY, "tolerance": 2.0}, path)
    with pytest.raises(accuracy_baselines.AccuracyBaselineError, match="does not match"):
        accuracy_baselines.write_entry("no-selection", ENTRY, path)
    assert path.read_bytes() == before and json.loads(before)["humaneval"] == {name: ENTRY}
