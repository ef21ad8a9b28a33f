"""The attention switch: --attention NAME and the reference's --fast_attention on `bench`, what the
models ran (results JSON), the perf combination id, and the one-line errors; on tiny local models."""

from __future__ import annotations

import json

import pytest
import torch

from harness.workload import attention, models, registry
from harness.core.errors import HarnessError
from harness.perf.combinations import Combination, PerfSettings
from test_cli import cli
from tiny_models import prompt, tiny_model, write_local_matrix


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory):
    return write_local_matrix(tmp_path_factory.mktemp("tiny"))


def test_fast_attention_on_a_cpu_is_sdpa_and_says_so():
    choice = attention.resolve(None, fast=True, device="cpu")
    assert choice.implementation == "sdpa"
    assert choice.note and choice.note.startswith("--fast-attention:") and "sdpa" in choice.note
    assert "\n" not in choice.note
    assert attention.resolve(None).implementation is None and attention.resolve(None).label == "sdpa"
    assert attention.resolve("eager").implementation == "eager" and attention.resolve("eager").note is None


@pytest.mark.parametrize("name, fast, message", [
    ("flash_attention_2", False, "--attention flash_attention_2: needs a CUDA GPU and the flash_attn package; "
                                 "on cpu choose eager, sdpa, flex_attention"),
    ("eagr", False, "--attention eagr: not an attention implementation. Did you mean 'eager'?"),
    ("eager", True, "--fast-attention and --attention eager: give one of them"),
])
def test_attention_that_cannot_run_here_is_a_one_line_error(name, fast, message):
    with pytest.raises(HarnessError) as info:
        attention.resolve(name, fast=fast, device="cpu")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_load_runs_the_asked_attention_and_eager_decodes_the_same_tokens_in_fp32(tiny_matrix):
    spec = registry.load_matrix(tiny_matrix).model("tiny-target")
    default = models.load(spec, "fp32")
    eager = models.load(spec, "fp32", attention="eager")
    assert (default.attention, eager.attention) == ("sdpa", "eager")
    ids = prompt()
    outs = [m.model.generate(ids, max_new_tokens=12, do_sample=False)[0].tolist() for m in (default, eager)]
    assert outs[0] == outs[1]


def test_load_of_an_unsupported_attention_is_a_one_line_error(tiny_matrix):
    spec = registry.load_matrix(tiny_matrix).model("tiny-target")
    with pytest.raises(HarnessError) as info:
        models.load(spec, "fp32", attention="flash_attention_2")
    assert str(info.value).startswith("model 'tiny-target': --attention flash_attention_2: ")
    assert "\n" not in str(info.value)


def test_bench_fast_attention_as_the_reference_spells_it(tiny_matrix, tmp_path):
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--fast_attention", "--draft-precision", "fp32",
            "--max-new-tokens", "6", "--limit", "1", "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert attention.FAST_ON_CPU_NOTE in r.stdout.splitlines()
    doc = json.loads(out.read_text())
    assert doc["settings"]["attention"] == "sdpa"
    assert doc["target"]["attention"] == doc["draft"]["attention"] == "sdpa"


def test_bench_attention_eager_is_recorded_for_target_and_draft(tiny_matrix, tmp_path):
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--attention", "eager", "--draft-precision", "fp32",
            "--max-new-tokens", "6", "--limit", "1", "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "attention  eager for target and draft" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["settings"]["attention"] == "eager"
    assert doc["target"]["attention"] == doc["draft"]["attention"] == "eager"


def test_bench_unknown_attention_fails_before_loading(tiny_matrix):
    r = cli("--matrix", str(tiny_matrix), "bench", "--attention", "flash", "--no-progress")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1
    assert errors[0].startswith("error: --attention flash: not an attention implementation.")
    assert "loaded" not in r.stderr


def test_the_perf_id_names_a_non_default_attention_and_old_workers_still_read_the_rest(tiny_matrix):
    m = registry.load_matrix(tiny_matrix)
    settings = PerfSettings.from_matrix(m)
    base = dict(pair="tiny+draft", target_precision="bf16", draft_precision="w8af32-tensor", platform="cpu",
                device="cpu", decoding="greedy", k=6, mode="assisted", slow=False)
    plain = Combination.from_request(m, base, settings)
    eager = Combination.from_request(m, {**base, "attention": "eager"}, settings)
    assert plain.id == "tiny+draft:bf16+w8af32-tensor:cpu:greedy:k6"
    assert eager.id == "tiny+draft:bf16+w8af32-tensor:cpu:greedy:k6:attn-eager"
    assert plain.model_key != eager.model_key
    # the request a worker of an older commit builds its own Combination(**fields) from: the same fields,
    # nothing it does not know (fields added later are written only when set)
    assert plain.as_request() == base and eager.as_request() == {**base, "attention": "eager"}


def test_the_matrix_schema_offers_the_implementations_attention_knows():
    schema = json.loads(registry.MATRIX_SCHEMA.read_text())
    entry = schema["properties"]["perf"]["properties"]["combinations"]["items"]["properties"]["attention"]
    assert set(entry["enum"]) <= set(attention.ON_CPU) | set(attention.GPU_ONLY)


def test_eager_and_sdpa_agree_on_a_tiny_model_in_fp32():
    model = tiny_model("qwen2", seed=0)
    ids = prompt()
    with torch.no_grad():
        sdpa = model(ids).logits
        model.set_attn_implementation("eager")
        eager = model(ids).logits
    assert torch.allclose(sdpa, eager, atol=1e-4)
