"""tests/accuracy/accuracy_common.py: which errors may skip an accuracy test (only a model that is
not here or cannot be had here; a corrupted model or data file fails), and the HumanEval rows it
writes to results/accuracy (each names its arm and keeps its completion)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.workload.selection import Request
from harness.accuracy import humaneval
from harness.workload import models
from harness.core.errors import HarnessError, IntegrityError
from harness.workload.registry import ModelSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "accuracy"))  # accuracy_common (its conftest adds it there)
import accuracy_common  # noqa: E402

HUMANEVAL_PAIR = "qwen-coder-1.5b+0.5b"  # the pair tests/accuracy/test_humaneval.py runs


def test_a_model_that_is_not_fetched_skips_with_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception,
                       match="model 'smollm2-135m-instruct' is not fetched .*Run: python -m harness models fetch"):
        accuracy_common.load(accuracy_common.matrix().model("smollm2-135m-instruct"), "fp32")


def test_in_ci_a_shipped_model_that_is_not_fetched_fails_and_a_hub_model_skips(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="model 'smollm2-135m-instruct' is not fetched .*CI: a model the "
                                                    "suite ships must be fetched"):
        accuracy_common.load(accuracy_common.matrix().model("smollm2-135m-instruct"), "fp32")
    with pytest.raises(pytest.skip.Exception, match="model 'opt-125m'"):  # on the hub only: not every machine has it
        accuracy_common.load(accuracy_common.matrix().model("opt-125m"), "fp32")


def under_the_rule(fn) -> tuple[str, object]:
    """What skip_if_model_missing makes of fn's error: ("skip", message) or ("raise", the exception).
    A skip is returned, not raised, so that a rule that skips too much fails these tests."""
    try:
        with accuracy_common.skip_if_model_missing():
            fn()
    except pytest.skip.Exception as exc:
        return "skip", str(exc)
    except Exception as exc:  # noqa: BLE001 - the test checks which one
        return "raise", exc
    return "ok", None


def test_a_model_that_cannot_be_had_here_skips(tmp_path):
    spec = ModelSpec(name="gone", source="local", path=tmp_path / "gone")
    what, message = under_the_rule(lambda: models.load(spec, "fp32"))
    assert what == "skip" and "model 'gone': " in message and "has no config.json" in message


def test_a_corrupted_model_file_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    spec = accuracy_common.matrix().model("smollm2-135m-instruct")
    gguf = tmp_path / spec.gguf.gguf_file
    gguf.write_bytes(b"GGUF but not the pinned bytes")
    what, exc = under_the_rule(lambda: models.convert_gguf(gguf, tmp_path / "out", spec))
    assert what == "raise" and isinstance(exc, IntegrityError), (what, exc)
    assert "does not match the registry's" in str(exc)


def test_a_corrupted_samples_file_fails(tmp_path):
    config = humaneval.build_generate_config(accuracy_common.matrix(), Request(pair=HUMANEVAL_PAIR), assisted=False)
    out = tmp_path / "plain.jsonl"
    humaneval._partial_path(out).write_text('{"task_id": "HumanEval/0", "completion"\n{}\n')
    what, exc = under_the_rule(lambda: humaneval.generate(config, out,
                                                          task_ids=["HumanEval/0"], progress=False))
    assert what == "raise" and isinstance(exc, humaneval.SamplesError), (what, exc)
    assert "plain.jsonl.partial:1" in str(exc)


def test_any_other_harness_error_fails():
    def fail():
        raise HarnessError("something else")

    what, exc = under_the_rule(fail)
    assert what == "raise" and type(exc) is HarnessError, (what, exc)


def test_humaneval_rows_name_their_arm_and_keep_the_completion(tmp_path, monkeypatch):
    problems = humaneval.problems()
    completions = {  # per arm, as generate writes them (extra fields included); one right, one wrong
        "plain": {"HumanEval/0": problems["HumanEval/0"]["canonical_solution"], "HumanEval/2": "    return 0.5\n"},
        "assisted": {"HumanEval/0": "    return True\n", "HumanEval/2": problems["HumanEval/2"]["canonical_solution"]},
    }
    evaluated = {}
    for arm, by_task in completions.items():
        samples = tmp_path / f"{arm}.jsonl"
        samples.write_text("".join(json.dumps({"task_id": t, "completion": c, "new_tokens": 3, "tokens": [5, 6, 7],
                                               "generation": {"mode": arm}}) + "\n" for t, c in by_task.items()))
        evaluated[arm] = humaneval.evaluate(samples, allow=True, workers=2,
                                            limits=humaneval.sandbox.Limits(timeout_s=5)).rows
    monkeypatch.setattr(accuracy_common, "RESULTS", tmp_path / "results")
    path = accuracy_common.save("humaneval-subset",
                                {"rows": accuracy_common.humaneval_rows(evaluated["plain"], evaluated["assisted"])})
    rows = json.loads(path.read_text())["rows"]

    assert [(r["arm"], r["task_id"], r["passed"]) for r in rows] == [
        ("plain", "HumanEval/0", True), ("plain", "HumanEval/2", False),
        ("assisted", "HumanEval/0", False), ("assisted", "HumanEval/2", True)]
    for row in rows:
        assert set(row) == {"task_id", "arm", "completion", "passed", "result"}
        assert row["completion"] == completions[row["arm"]][row["task_id"]]
        assert (row["result"] == "passed") == row["passed"]
    for arm in completions:
        # the saved rows are re-checkable: their task_id and completion evaluate to the same verdicts
        mine = [r for r in rows if r["arm"] == arm]
        again = tmp_path / f"{arm}-again.jsonl"
        again.write_text("".join(json.dumps({"task_id": r["task_id"], "completion": r["completion"]}) + "\n"
                                 for r in mine))
        rechecked = humaneval.evaluate(again, allow=True, workers=2, limits=humaneval.sandbox.Limits(timeout_s=5))
        assert [(r["passed"], r["result"]) for r in rechecked.rows] == [(r["passed"], r["result"]) for r in mine]
