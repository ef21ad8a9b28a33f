"""The reference example's command line on `python -m harness bench`: --model_name and the underscore
spellings of its options, on tiny local models."""

from __future__ import annotations

import json

import pytest

from harness.workload import registry
from harness.core.errors import UnknownNameError
from test_cli import cli
from tiny_models import write_local_matrix


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory):
    path = write_local_matrix(tmp_path_factory.mktemp("tiny"))
    path.write_text(path.read_text().replace('[pairs."tiny+draft"]\n',
                                             '[pairs."tiny+draft"]\nreference_names = ["Tiny-7b-hf"]\n'))
    return path


def test_model_name_takes_reference_names_and_registry_targets(tiny_matrix):
    m = registry.load_matrix(tiny_matrix)
    assert m.pair_for_model_name("Tiny-7b-hf").name == "tiny+draft"
    # two pairs have this target: the default pair (with a draft) wins over prompt lookup
    assert m.pair_for_model_name("tiny-target").name == "tiny+draft"
    with pytest.raises(UnknownNameError) as info:
        m.pair_for_model_name("Tiny-7b")
    assert "Did you mean 'Tiny-7b-hf'?" in str(info.value) and "\n" not in str(info.value)


def test_the_reference_command_line_runs_as_written(tiny_matrix, tmp_path):
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--model_name", "Tiny-7b-hf", "--task", "decode",
            "--assisted_generation", "--draft_precision", "fp32", "--do_sample", "--temperature", "1.0",
            "--max_new_tokens=8", "--num_assistant_tokens", "3", "--limit", "1", "--no-progress",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    for column in ("Prompt Length (tokens)", "New Tokens Generated", "Total Time (s)", "Prefill Phase (ms)",
                   "Time/Token (ms)", "Tokens/Sec"):
        assert column in r.stdout
    doc = json.loads(out.read_text())
    assert doc["pair"] == "tiny+draft" and doc["settings"]["do_sample"] is True
    assert doc["settings"]["temperature"] == 1.0 and doc["settings"]["ks"] == [3]
    assert [s["mode"] for s in doc["summary"]] == ["assisted"]


def test_model_name_and_pair_together_is_refused(tiny_matrix):
    r = cli("--matrix", str(tiny_matrix), "bench", "--model_name", "Tiny-7b-hf", "--pair", "tiny+draft")
    assert r.returncode != 0 and "not allowed with argument" in r.stderr
