"""humaneval.evaluate / generate file handling: strict samples, results in input order, extra fields kept,
pass@k, resumable generation on tiny local models, and the CLI's refusal without permission."""

from __future__ import annotations

import json

import pytest

from harness import humaneval, registry
from harness.__main__ import main
from tiny_models import write_local_matrix

P0 = humaneval.problems()["HumanEval/0"]


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_results_in_input_order_with_extra_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ALLOW_CODE_EXECUTION", "1")
    rows = [{"task_id": "HumanEval/2", "completion": "    return number % 1.0\n", "mine": 1},
            {"task_id": "HumanEval/0", "completion": "    return True\n", "mine": 2},
            {"task_id": "HumanEval/0", "completion": P0["canonical_solution"], "mine": 3},
            {"task_id": "HumanEval/2", "completion": "    while True: pass\n", "mine": 4}]
    samples = write(tmp_path / "s.jsonl", rows)
    s = humaneval.evaluate(samples, workers=2, limits=humaneval.sandbox.Limits(timeout_s=2))
    out = [json.loads(l) for l in (tmp_path / "s.jsonl_results.jsonl").read_text().splitlines()]
    assert [r["mine"] for r in out] == [1, 2, 3, 4]
    assert [r["passed"] for r in out] == [True, False, True, False]
    assert out[1]["result"].startswith("failed:") and out[3]["result"] == "timed out"
    assert s.pass_at[1] == pytest.approx((1 / 2 + 1 / 2) / 2)


@pytest.mark.parametrize("line, message", [
    ('{"task_id": "HumanEval/0"}', "'completion' must be a string"),
    ('{"task_id": "HumanEval/999", "completion": ""}', "HumanEval/999"),
    ('{"task_id": "HumanEval/0", "completion": "x"', "not valid JSON"),
    ('["HumanEval/0"]', "JSON object"),
    ('{"task_id": "HumanEval/0", "completion": "", "task_id": "HumanEval/1"}', "duplicate key"),
    ('{"task_id": "HumanEval/0", "completion": "", "passed": true, "result": "passed"}', "results file"),
])
def test_bad_samples_name_file_and_line(tmp_path, line, message):
    samples = write(tmp_path / "bad.jsonl", [{"task_id": "HumanEval/1", "completion": ""}, line])
    with pytest.raises(humaneval.SamplesError if "HumanEval/999" not in line else Exception) as err:
        humaneval.read_samples(samples, humaneval.problems())
    assert f"{samples}:2" in str(err.value) and message in str(err.value)


def test_pass_at_k_estimator():
    assert humaneval.pass_at_k(10, 0, 1) == 0 and humaneval.pass_at_k(10, 10, 1) == 1
    assert humaneval.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert humaneval.pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)


def test_truncate_at_first_stop():
    assert humaneval.truncate_at_stops("    return 1\n\ndef g():\n#x", ["\n#", "\ndef "]) == "    return 1\n"
    assert humaneval.truncate_at_stops("abc", ["\n#"]) == "abc"


def test_cli_refuses_without_permission(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HARNESS_ALLOW_CODE_EXECUTION", raising=False)
    samples = write(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": P0["canonical_solution"]}])
    assert main(["humaneval", "evaluate", str(samples)]) == 2
    err = capsys.readouterr().err
    assert "--allow-code-execution" in err and "HARNESS_ALLOW_CODE_EXECUTION=1" in err
    assert not (tmp_path / "s.jsonl_results.jsonl").exists()
    assert main(["humaneval", "evaluate", str(samples), "--allow-code-execution", "--no-progress"]) == 0
    assert "pass@1: 1.0000" in capsys.readouterr().out


def test_generate_writes_atomically_and_resumes(tmp_path):
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    config = humaneval.build_generate_config(matrix, "tiny+draft", assisted=True, max_new_tokens=6)
    out = tmp_path / "samples.jsonl"
    tasks = ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    # an interrupted run: two rows written, the second torn mid-line
    first = humaneval.generate(matrix, config, tmp_path / "first.jsonl", task_ids=tasks[:1], progress=False)
    row = first.rows[0]
    partial = humaneval._partial_path(out)
    partial.write_text(json.dumps(row) + "\n" + json.dumps(row)[:20])
    s = humaneval.generate(matrix, config, out, task_ids=tasks, progress=False)
    assert s.resumed == 1 and s.tasks == 3 and not partial.exists()
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["task_id"] for l in lines] == tasks and lines[0] == row
    # settings changed: the partial file is not silently mixed in
    partial.write_text(json.dumps(row) + "\n")
    other = humaneval.build_generate_config(matrix, "tiny+draft", assisted=False, max_new_tokens=6)
    with pytest.raises(humaneval.SamplesError, match="other settings"):
        humaneval.generate(matrix, other, out, task_ids=tasks, progress=False)


def test_generate_extends_a_finished_run_and_never_shrinks_it(tmp_path):
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    config = humaneval.build_generate_config(matrix, "tiny+draft", assisted=False, max_new_tokens=6)
    out = tmp_path / "samples.jsonl"
    tasks = ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    first = humaneval.generate(matrix, config, out, task_ids=tasks[:2], progress=False)
    assert first.resumed == 0 and first.tasks == 2
    # a larger selection (make humaneval-full's growing --limit) keeps the finished rows
    s = humaneval.generate(matrix, config, out, task_ids=tasks, progress=False)
    assert s.resumed == 2 and s.tasks == 3 and s.rows[:2] == first.rows
    assert [json.loads(l)["task_id"] for l in out.read_text().splitlines()] == tasks
    # a smaller one would drop rows from OUT: refused, the file unchanged
    before = out.read_bytes()
    with pytest.raises(humaneval.SamplesError, match="outside this selection"):
        humaneval.generate(matrix, config, out, task_ids=tasks[:1], progress=False)
    assert out.read_bytes() == before
    # --no-resume replaces it
    s = humaneval.generate(matrix, config, out, task_ids=tasks[:1], resume=False, progress=False)
    assert s.resumed == 0 and len(out.read_text().splitlines()) == 1
