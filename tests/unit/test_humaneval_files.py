"""humaneval.evaluate / generate file handling: strict samples, results in input order, extra fields kept,
pass@k, resumable generation on tiny local models, and the CLI's refusal without permission."""

from __future__ import annotations

import contextlib
import json

import pytest

from harness.workload.selection import Request
from harness.accuracy import humaneval
from harness.workload import registry
from harness.cli.main import main
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
    config = humaneval.build_generate_config(matrix, Request(pair="tiny+draft", max_new_tokens=6), assisted=True)
    out = tmp_path / "samples.jsonl"
    tasks = ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    # an interrupted run: two rows written, the second torn mid-line
    first = humaneval.generate(config, tmp_path / "first.jsonl", task_ids=tasks[:1], progress=False)
    row = first.rows[0]
    partial = humaneval._partial_path(out)
    partial.write_text(json.dumps(row) + "\n" + json.dumps(row)[:20])
    s = humaneval.generate(config, out, task_ids=tasks, progress=False)
    assert s.resumed == 1 and s.tasks == 3 and not partial.exists()
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["task_id"] for l in lines] == tasks and lines[0] == row
    # settings changed: the partial file is not silently mixed in
    partial.write_text(json.dumps(row) + "\n")
    other = humaneval.build_generate_config(matrix, Request(pair="tiny+draft", max_new_tokens=6), assisted=False)
    with pytest.raises(humaneval.SamplesError, match="other settings"):
        humaneval.generate(other, out, task_ids=tasks, progress=False)


def test_generate_extends_a_finished_run_and_never_shrinks_it(tmp_path):
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    config = humaneval.build_generate_config(matrix, Request(pair="tiny+draft", max_new_tokens=6), assisted=False)
    out = tmp_path / "samples.jsonl"
    tasks = ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    first = humaneval.generate(config, out, task_ids=tasks[:2], progress=False)
    assert first.resumed == 0 and first.tasks == 2
    # a larger selection (make humaneval-full's growing --limit) keeps the finished rows
    s = humaneval.generate(config, out, task_ids=tasks, progress=False)
    assert s.resumed == 2 and s.tasks == 3 and s.rows[:2] == first.rows
    assert [json.loads(l)["task_id"] for l in out.read_text().splitlines()] == tasks
    # a smaller one would drop rows from OUT: refused, the file unchanged
    before = out.read_bytes()
    with pytest.raises(humaneval.SamplesError, match="outside this selection"):
        humaneval.generate(config, out, task_ids=tasks[:1], progress=False)
    assert out.read_bytes() == before
    # --no-resume replaces it
    s = humaneval.generate(config, out, task_ids=tasks[:1], resume=False, progress=False)
    assert s.resumed == 0 and len(out.read_text().splitlines()) == 1


def test_compare_pairs_runs_triages_divergences_and_flags_a_wrong_token(tmp_path, capsys, monkeypatch):
    from harness.workload import models

    # prompts in the tiny word tokenizer's vocabulary (HumanEval's text would all be <pad>: zero logits)
    real = humaneval.problems()
    words = {tid: {**real[tid], "prompt": " ".join(f"w{(7 * i + 3 * j) % 90 + 3}" for j in range(12))}
             for i, tid in enumerate(real)}
    monkeypatch.setattr(humaneval, "problems", lambda: words)
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    tasks = ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    runs = {}
    for assisted in (False, True):
        config = humaneval.build_generate_config(matrix, Request(pair="tiny+draft", max_new_tokens=6), assisted=assisted)
        runs[assisted] = humaneval.generate(config, tmp_path / f"{assisted}.jsonl", task_ids=tasks,
                                            progress=False).out
    target = models.load(matrix.model("tiny-target"), "fp32")
    c = humaneval.compare(runs[False], runs[True], triage_with=lambda config: target)
    assert [t.task_id for t in c.tasks] == tasks and c.triage_counts() == {"exact": 3, "near-tie": 0, "failed": 0}
    with pytest.raises(humaneval.SamplesError, match="a plain run, then an assisted one"):
        humaneval.compare(runs[True], runs[False])

    # planted: the assisted run took a token the target would not pick at new token 2 of task 1
    rows = [json.loads(l) for l in runs[True].read_text().splitlines()]
    from harness.accuracy.equivalence import next_token_logits

    ids = target.tokenizer(humaneval.problems()["HumanEval/1"]["prompt"], return_tensors="pt")["input_ids"]
    rows[1]["tokens"][2] = int(next_token_logits(target.model, ids, rows[1]["tokens"][:2]).argmin())
    rows[1]["completion"] += "x"
    write(runs[True], rows)
    c = humaneval.compare(runs[False], runs[True], triage_with=lambda config: target)
    assert c.triage_counts() == {"exact": 2, "near-tie": 0, "failed": 1}
    assert c.tasks[1].triage == "failed" and "at new token 2" in c.tasks[1].detail and c.equal == 2

    # equal completions with different verdicts: the CLI fails (the sandbox would not be deterministic)
    for path, verdicts in ((runs[False], [True, False, True]), (runs[True], [False, False, True])):
        rs = [json.loads(l) for l in path.read_text().splitlines()]
        write(humaneval.results_path(path), [{**r, "passed": v, "result": "passed" if v else "failed: x"}
                                             for r, v in zip(rs, verdicts)])
    c = humaneval.compare(runs[False], runs[True])
    assert c.verdict_mismatches_on_equal == ["HumanEval/0"]
    assert c.pass_at_1("plain") == pytest.approx(2 / 3) and c.pass_at_1("assisted") == pytest.approx(1 / 3)
    assert main(["--matrix", str(write_local_matrix(tmp_path)), "humaneval", "compare", str(runs[False]),
                 str(runs[True]), "--no-progress", "--json", str(tmp_path / "compare.json")]) == 1
    assert "EQUAL: the sandbox is not deterministic" in capsys.readouterr().out
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["equal"] == 2 and doc["plain_pass_at_1"] == pytest.approx(2 / 3) and doc["triage"] is None
    assert [t["task_id"] for t in doc["tasks"]] == tasks and doc["assisted"] == str(runs[True])


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "argument --k: 0 is outside 1..1000"),
    (["--k", "-1"], "argument --k: -1 is outside 1..1000"),
    (["--k", "1,x"], "argument --k: 'x' is not an integer"),
    (["--k", "2"], "--k 2: "),  # one sample per task: refused before any program runs
])
def test_evaluate_refuses_a_bad_k_before_running_anything(tmp_path, capsys, args, message):
    samples = write(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": P0["canonical_solution"]}])
    with pytest.raises(SystemExit) if args[1] != "2" else contextlib.nullcontext():
        assert main(["humaneval", "evaluate", str(samples), "--allow-code-execution", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "s.jsonl_results.jsonl").exists()


def test_task_ids_naming_no_task_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["humaneval", "generate", "--task-ids", ",", "--out", str(tmp_path / "o.jsonl")])
    assert "argument --task-ids: ',' names no task id" in capsys.readouterr().err


def test_an_unwritable_results_path_is_one_line(tmp_path, capsys):
    samples = write(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": P0["canonical_solution"]}])
    (tmp_path / "s.jsonl_results.jsonl").mkdir()  # a folder where the results file goes
    assert main(["humaneval", "evaluate", str(samples), "--allow-code-execution", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "s.jsonl_results.jsonl" in err and "Traceback" not in err


def test_compare_of_runs_whose_times_are_zero_prints_no_rate(tmp_path, capsys):
    from harness.cli.humaneval import print_comparison

    c = humaneval.Comparison(plain=tmp_path / "p.jsonl", assisted=tmp_path / "a.jsonl",
                             config={"pair": "tiny+draft", "target_precision": "fp32"}, tasks=[], plain_seconds=0.0,
                             assisted_seconds=0.0, plain_tokens=12, assisted_tokens=12, evaluated=False)
    print_comparison(c)  # was ZeroDivisionError
    out = capsys.readouterr().out
    assert "12 new tokens in 0.0 s (n/a tokens/s)" in out and "the same tasks n/a" in out
