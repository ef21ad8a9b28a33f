"""The CLI end to end on tiny local models (no downloads), and its errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.cli.options import parse_ks
from harness.core.errors import MissingModelError, UnsupportedHereError
from harness.machine.platform import device_available
from harness.measure.report import read_json
from tiny_models import write_local_matrix


def cli(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory):
    return write_local_matrix(tmp_path_factory.mktemp("tiny"))


def test_bench_with_the_fused_draft_and_the_lookup_first(tiny_matrix, tmp_path):
    """--fused-draft and --lookup-first end to end: the same tokens as plain, the settings in the
    results, and the lookup's share of steps on the terminal."""
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "-k", "3", "--max-new-tokens", "24",
            "--fused-draft", "--lookup-first", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "fused draft loop (given)" in r.stdout and "prompt lookup first on 1 matching tokens (given)" in r.stdout
    assert "same tokens as plain on 3/3 prompts" in r.stdout
    assert "steps proposed by the prompt lookup" in r.stdout
    doc = read_json(out)
    assert doc["settings"]["fused_draft"] is True and doc["settings"]["lookup_first"] == 1
    assert doc["selection"]["values"]["fused_draft"] is True
    samples = [x for row in doc["rows"] if row["mode"] == "assisted" for x in row["samples"]]
    assert samples and all(len(x["lookup_per_step"]) == len(x["accepted_per_step"]) for x in samples)
    bad = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "--fused-draft", "--do-sample")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error: ")]
    assert bad.returncode != 0 and len(errors) == 1, bad.stderr
    assert errors[0].startswith("error: --fused-draft: the fused draft loop drafts greedily"), bad.stderr


def test_bench_compare_on_tiny_local_models(tiny_matrix, tmp_path):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "-k", "2,4", "--repeats", "2",
            "--json", str(out), "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    for column in ("Example#", "Prompt Length (tokens)", "New Tokens Generated", "Total Time (s)",
                   "Prefill Phase (ms)", "Time/Token (ms)", "Tokens/Sec", "Accepted/Drafted",
                   "Mean Accepted Length", "Target Forwards", "Speedup"):
        assert column in r.stdout
    assert "Summary (medians over prompts):" in r.stdout
    assert "assisted k=4: median" in r.stdout and "same tokens as plain on 3/3 prompts" in r.stdout
    doc = read_json(out)  # validated against the schema on read too
    assert doc["schema_version"] == 6 and doc["pair"] == "tiny+draft"
    origin = doc["provenance"]  # the commit this test runs from, the machine, and the probe taken before the run
    assert origin["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                              cwd=os.path.dirname(__file__)).stdout.strip()
    assert origin["platform_id"] == doc["platform"]["id"] and origin["host_probe"]["rates"]["memory_gbs"] > 0
    assert origin["software"]["torch"] == doc["platform"]["torch"] and isinstance(origin["dirty"], bool)
    assert [s["configuration"] for s in doc["summary"]] == ["plain", "assisted k=2", "assisted k=4"]
    assisted = [row for row in doc["rows"] if row["mode"] == "assisted"]
    assert all(row["same_tokens_as_plain"] for row in assisted)  # fp32: exact
    assert all(len(row["samples"]) == 2 for row in doc["rows"])
    assert all(row["new_tokens"] == row["target_forwards"] + row["accepted"] for row in assisted)
    assert "| Example# |" in md.read_text()


def test_bench_prompt_lookup_and_fixed_length_task(tiny_matrix, tmp_path):
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--pair", "tiny+lookup", "--task", "benchmark",
            "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [row["prompt_tokens"] for row in doc["rows"] if row["mode"] == "plain"] == [8, 16]
    assert all(row["new_tokens"] == 24 for row in doc["rows"])  # min_new_tokens == max_new_tokens
    assert {row["mode"] for row in doc["rows"]} == {"plain", "prompt-lookup"}


@pytest.mark.parametrize("args, message", [
    (["bench", "--pair", "nope"], "error: Unknown pair 'nope'."),
    (["bench", "--pair", "smollm2-135m+slf"], "Did you mean 'smollm2-135m+self'?"),
    (["bench", "--draft-precision", "int3"], "argument --draft-precision: invalid choice: 'int3' (choose from"),
    (["bench", "-k", "0"], "argument --num-assistant-tokens/-k: '0': every K must be within 1..64"),
    (["bench", "-k", "two"], "give K as 6, a list 2,4,6 or a range 2-8"),
    (["bench", "--top-p", "1.5"], "argument --top-p: 1.5 is outside (0.0, 1.0]"),
    (["bench", "--temperature", "0.1"], "error: --temperature and --top-p apply to sampling; add --do-sample"),
    (["bench", "--schedule", "fast"], "argument --schedule: invalid choice"),
    (["bench", "--task", "chat"], "argument --task: invalid choice"),
    (["bench", "--platform", "tpu"], "Unknown platform 'tpu'"),
    (["bench", "--pair", "smollm2-135m+lookup", "--draft-precision", "bf16"], "--draft-precision bf16: this run has no draft model"),
])
def test_bad_options_name_the_option(args, message, tmp_path):
    r = cli(*args, env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_platform_cuda_follows_this_machine(tmp_path):
    r = cli("bench", "--pair", "smollm2-135m+self", "--platform", "cuda", env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert "Traceback" not in r.stderr
    if reason := device_available("cuda"):
        assert f"error: --platform cuda: {reason}" in r.stderr
        assert r.returncode == UnsupportedHereError.exit_status  # this machine cannot run it: 4
    else:  # the device check passes; the run stops at the model, which this empty cache lacks
        assert r.returncode == MissingModelError.exit_status
        assert "no CUDA device" not in r.stderr
        assert "model 'smollm2-135m-instruct' is not fetched" in r.stderr


def test_quantization_the_model_cannot_take_is_one_line(tiny_matrix, tmp_path):
    # int4 needs in_features divisible by its group size (128); the tiny target's are 64
    r = cli("--matrix", str(tiny_matrix), "bench", "--plain", "--no-progress", "--target-precision", "w4abf16-rtn",
            env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0])
    assert errors[0].startswith("error: model 'tiny-target' at precision w4abf16-rtn: layer ")
    assert "in_features 64 is not a multiple of group_size 128" in errors[0]


def test_unfetched_model_gives_the_fetch_command(tmp_path):
    r = cli("bench", "--pair", "smollm2-135m+self", env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == MissingModelError.exit_status == 3
    assert "model 'smollm2-135m-instruct' is not fetched" in r.stderr
    assert "Run: python -m harness models fetch smollm2-135m-instruct" in r.stderr


def test_models_list_shows_status(tmp_path):
    r = cli("models", "list", env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert str(tmp_path) in r.stdout
    line = next(l for l in r.stdout.splitlines() if l.startswith("qwen2.5-coder-1.5b-instruct"))
    assert "pypi-gguf" in line and "missing" in line and "22 PyPI package(s)" in line
    assert any(l.startswith("opt-6.7b") and "hub" in l for l in r.stdout.splitlines())


def test_offline_hub_fetch_is_one_line(tmp_path):
    r = cli("models", "fetch", "opt-125m",
            env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HARNESS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 1
    assert "opt-125m: FAILED: model 'opt-125m' (facebook/opt-125m) is not in the local hub cache" in r.stderr
    assert "Traceback" not in r.stderr


def test_pairs_lists_the_default():
    r = cli("pairs")
    assert r.returncode == 0
    assert "qwen-coder-1.5b+0.5b [default]" in r.stdout


def test_pairs_show_the_choice_of_the_class_this_runs_as():
    r = cli("pairs", env={"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    assert r.returncode == 0, r.stderr
    assert "chosen for CPU class avx2" in r.stdout
    default = next(line for line in r.stdout.splitlines() if "[default]" in line)
    assert "(w8af32)" in default and "K=16" in default and "[avx2 choice]" in default


def test_parse_ks():
    assert parse_ks("6") == (6,)
    assert parse_ks("2-4,8") == (2, 3, 4, 8)
    assert parse_ks("3,3") == (3,)


def test_bench_appends_its_medians_to_the_history(tiny_matrix, tmp_path):
    from harness.history import store

    history = tmp_path / "history.sqlite"
    for _ in range(2):
        r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "-k", "2", "--limit", "2",
                "--max-new-tokens", "8", "--history", str(history))
        assert r.returncode == 0, r.stderr
        assert f"appended to {history}" in r.stdout
    with store.open_store(history) as s:
        assert s.runs() == 2  # two runs, two dates: both kept
        points = s.series(metric="tokens_per_sec")
    names = {p.measurement.combination for p in points}
    assert names == {"bench:tiny+draft:fp32+fp32:decode:plain", "bench:tiny+draft:fp32+fp32:decode:assisted k=2"}
    assert all(p.commit and p.platform_id and p.measurement.n == 2 and p.measurement.median > 0 for p in points)
