"""What to run is resolved once (harness/workload/selection.py): each value from the request, the preset,
the CPU class's choice, the pair or the registry's defaults, with that origin recorded; bad input is
one line naming the option; a target given by path runs without a pair; and downstream of the
resolver nothing reads K or a precision from the registry again."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from harness.measure import bench
from harness.workload import registry
from harness.core.errors import HarnessError, RegistryError, UnknownNameError
from harness.workload.selection import Request, resolve
from tiny_models import write_local_matrix

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = registry.DEFAULT_MATRIX
DEFAULT_PAIR = "qwen-coder-1.5b+0.5b"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return registry.load_matrix(write_local_matrix(tmp_path_factory.mktemp("tiny")))


def test_each_value_comes_from_the_first_layer_that_has_it_and_says_which():
    avx2 = registry.load_matrix(PACKAGED, cpu_class="avx2")
    chosen = resolve(avx2, Request(check_here=False))  # the default pair, as chosen for AVX2
    assert (chosen.pair, chosen.target.precision, chosen.k) == (DEFAULT_PAIR, "w8af32", 16)
    assert chosen.origin("target_precision") == chosen.origin("k") == chosen.origin("fused_draft") == "cpu-class avx2"
    assert chosen.origin("schedule") == chosen.origin("max_new_tokens") == "defaults"
    assert chosen.origin("target") == f"pair {DEFAULT_PAIR}" and chosen.reference_precision is None
    preset = resolve(avx2, Request(preset="fastest", ks=(4,), check_here=False))
    assert (preset.target.precision, preset.draft.precision, preset.k) == ("w8af32", "w8af32-tensor", 4)
    assert preset.origin("k") == "given" and preset.origin("target_precision") == "preset fastest"
    assert preset.reference_precision == "bf16" and preset.origin("reference_precision") == "preset fastest"
    zen4 = resolve(registry.load_matrix(PACKAGED, cpu_class="avx512-bf16"), Request(check_here=False))
    assert (zen4.k, zen4.decode.fused_draft, zen4.decode.confidence_threshold) == (16, True, 0.6)
    assert zen4.origin("confidence_threshold") == zen4.origin("fused_draft") == "cpu-class avx512-bf16"
    assert "fused draft loop (cpu-class avx512-bf16), a step ends below confidence 0.6 (cpu-class avx512-bf16)" in (
        zen4.headline())
    given = resolve(registry.load_matrix(PACKAGED, cpu_class="avx512-bf16"),
                    Request(confidence_threshold=0.0, fused_draft=False, check_here=False))
    assert (given.decode.fused_draft, given.decode.confidence_threshold, given.origin("fused_draft")) == (
        False, 0.0, "given")
    generic = resolve(registry.load_matrix(PACKAGED, cpu_class="generic"), Request(check_here=False))
    assert generic.origin("k") == f"pair {DEFAULT_PAIR}" and "not measured on this class" in generic.reasons[0]


def test_a_cpu_class_choice_stays_on_the_cpu():
    """The class's choice was measured on this CPU's kernels: a CUDA run on the same host takes the
    pair's own K and drafting, not the AVX512-BF16 class's K=16, fused loop and threshold."""
    amd = registry.load_matrix(PACKAGED, cpu_class="avx512-bf16")
    cpu = resolve(amd, Request(check_here=False))
    assert (cpu.k, cpu.decode.fused_draft, cpu.decode.confidence_threshold) == (16, True, 0.6)
    gpu = resolve(amd, Request(platform="cuda", check_here=False))
    assert (gpu.k, gpu.decode.fused_draft, gpu.decode.confidence_threshold) == (6, False, 0.0)
    assert gpu.origin("k") == f"pair {DEFAULT_PAIR}" and gpu.origin("target_precision") == f"pair {DEFAULT_PAIR}"
    assert gpu.reasons == (f"not on the CPU: the pair's own settings ({DEFAULT_PAIR}.per_cpu_class is measured on "
                           "CPU kernels)",)


def test_decode_settings_are_built_here_and_mean_the_same_for_every_caller(tiny):
    s = resolve(tiny, Request(pair="tiny+draft"))
    d = tiny.defaults
    assert (s.decode.schedule, s.decode.confidence_threshold, s.decode.max_new_tokens) == (
        d.schedule, d.confidence_threshold, d.max_new_tokens)
    assert (s.decode.min_new_tokens, s.decode.do_sample, s.decode.temperature, s.decode.top_p) == (0, False, 1.0, 1.0)
    greedy = resolve(tiny, Request(pair="tiny+draft", temperature=0.1, top_p=0.9))
    assert (greedy.decode.temperature, greedy.decode.top_p) == (1.0, 1.0)  # they apply to sampling only
    sampled = resolve(tiny, Request(pair="tiny+draft", do_sample=True, temperature=0.1, top_p=0.9, seed=7))
    assert (sampled.decode.temperature, sampled.decode.top_p, sampled.decode.seed) == (0.1, 0.9, 7)
    fixed = resolve(tiny, Request(pair="tiny+draft", task="benchmark", schedule="heuristic", max_new_tokens=16))
    assert (fixed.decode.min_new_tokens, fixed.decode.schedule, fixed.prompt_set.name) == (16, "heuristic", "lengths")
    assert fixed.origin("schedule") == "given" and fixed.origin("prompt_set") == "task benchmark"
    code = resolve(tiny, Request(pair="tiny+draft", prompt_set="humaneval-all"))
    assert code.decode.stop_sequences == tiny.prompt_set("humaneval-all").stop_sequences
    lookup = resolve(tiny, Request(pair="tiny+draft", prompt_lookup=5))
    assert (lookup.mode, lookup.draft, lookup.ks) == ("prompt-lookup", None, (5,))
    assert s.decode.lookup_first == 0 and s.as_values()["lookup_first"] == 0
    first = resolve(tiny, Request(pair="tiny+draft", lookup_first=2))
    assert (first.mode, first.decode.lookup_first, first.origin("lookup_first")) == ("assisted", 2, "given")
    assert first.as_values()["lookup_first"] == 2 and "prompt lookup first on 2 matching tokens" in first.headline()


@pytest.mark.parametrize("request_, option, allowed", [
    (Request(pair="tiny+draft", target_precision="bf61"), "--target-precision", "Did you mean 'bf16'?"),
    (Request(pair="tiny+draft", ks=(0,)), "--num-assistant-tokens 0", "1 or more"),
    (Request(pair="tiny+draft", preset="fastest"), "--preset fastest", "has no presets"),
    (Request(pair="tiny+lookup", draft_precision="bf16"), "--draft-precision bf16", "no draft model"),
    (Request(pair="tiny+draft", prompt_lookup=4, draft_vocab=8), "--draft-vocab 8", "no draft model"),
    (Request(pair="tiny+draft", attention="flash"), "--attention flash", "On cpu: eager, sdpa"),
    (Request(pair="tiny+draft", prompt_lookup=4, ks=(6,)), "--prompt-lookup 4", "drop --num-assistant-tokens"),
    (Request(pair="tiny+drafts"), "Unknown pair 'tiny+drafts'", "Did you mean 'tiny+draft'?"),
    (Request(pair="tiny+lookup", lookup_first=2), "--lookup-first 2", "needs a draft model"),
    (Request(pair="tiny+draft", prompt_lookup=4, lookup_first=2), "--lookup-first 2", "needs a draft model"),
    (Request(pair="tiny+draft", lookup_first=0), "--lookup-first 0", "1 to 3 tokens"),
    (Request(pair="tiny+draft", lookup_first=4), "--lookup-first 4", "1 to 3 tokens"),
])
def test_bad_input_is_one_line_naming_the_option_the_value_and_what_is_allowed(tiny, request_, option, allowed):
    with pytest.raises(HarnessError) as info:
        resolve(tiny, request_)
    message = str(info.value)
    assert option in message and allowed in message and "\n" not in message, message


def test_an_option_is_named_as_its_caller_spells_it(tiny):
    with pytest.raises(UnknownNameError, match="--perf-precision precision 'fp31'"):
        resolve(tiny, Request(pair="tiny+draft", target_precision="fp31",
                              option_names={"target_precision": "--perf-precision"}))


def test_a_target_given_by_path_runs_without_a_pair(tiny, tmp_path):
    folder = tiny.model("tiny-target").path
    # the tiny registry has no defaults for a model without a pair: each missing value is named
    with pytest.raises(RegistryError, match="give --target-precision or add defaults.target_precision"):
        resolve(tiny, Request(target=str(folder)))
    with pytest.raises(RegistryError, match="add defaults.num_assistant_tokens"):
        resolve(tiny, Request(target=str(folder), target_precision="fp32", prompt_lookup=None))
    s = resolve(tiny, Request(target=str(folder), draft="tiny-draft", target_precision="fp32",
                              draft_precision="fp32", ks=(3,), task="benchmark"))
    assert (s.pair, s.mode, s.target.spec.source, s.target.spec.path) == ("target+tiny-draft", "assisted", "local",
                                                                          folder)
    assert s.origin("target") == s.origin("draft") == s.origin("k") == "given" and s.reasons == ()
    alone = resolve(tiny, Request(target=str(folder), target_precision="fp32", ks=(3,), task="benchmark"))
    assert (alone.pair, alone.mode, alone.draft) == ("target+lookup", "prompt-lookup", None)
    # with the registry's defaults for such models, nothing else is needed
    text = Path(tiny.path).read_text().replace(
        'prompt_lookup_ngram = 3\n', 'prompt_lookup_ngram = 3\ntarget_precision = "fp32"\ndraft_precision = "fp32"\n'
                                     'num_assistant_tokens = 2\nprompt_set = "tiny-prompts"\n')
    (tmp_path / "matrix.toml").write_text(text)
    defaults = registry.load_matrix(tmp_path / "matrix.toml")
    d = resolve(defaults, Request(target=str(folder), draft=str(tiny.model("tiny-draft").path)))
    assert (d.target.precision, d.draft.precision, d.k, d.prompt_set.name) == ("fp32", "fp32", 2, "tiny-prompts")
    assert d.origin("k") == d.origin("prompt_set") == "defaults"
    with pytest.raises(UnknownNameError, match="Unknown --target model 'no/such/folder/x'"):
        resolve(tiny, Request(target="no/such/folder/x"))


def test_a_draft_given_with_the_default_pair_replaces_only_its_draft(tiny):
    s = resolve(tiny, Request(draft=str(tiny.model("tiny-target").path)))
    assert s.target.name == "tiny-target" and s.draft.spec.source == "local" and s.k == 4
    assert s.origin("draft") == "given" and s.origin("k") == "pair tiny+draft"


def test_downstream_reads_k_and_the_draft_precision_from_the_selection_only(tiny, monkeypatch):
    """After resolving, the pair's registry values change; bench, the perf runner and HumanEval must
    still run the selection's K and draft precision (a re-read of the registry would not)."""
    from harness.accuracy import humaneval
    from harness.measure import generate
    from harness.workload import models
    from harness.perf.combinations import Combination, PerfSettings
    from harness.perf.runner import Runner, load_pair

    m = registry.load_matrix(tiny.path)
    cfg = bench.build_config(m, Request(pair="tiny+draft", max_new_tokens=6), limit=1)
    settings = PerfSettings.from_matrix(m, rounds=1, max_rounds=1, prompts=1)
    combo = Combination(cfg.selection, "greedy")
    he = humaneval.build_generate_config(m, Request(pair="tiny+draft", max_new_tokens=4), assisted=True)
    original = m.pairs["tiny+draft"]
    m.pairs["tiny+draft"] = dataclasses.replace(original, num_assistant_tokens=9, draft_precision="bf16",
                                                target_precision="bf16")
    ks, precisions = [], []
    real_generate, real_load = generate.measure_generation, models.load

    def spy_generate(*args, k=None, **kwargs):
        ks.append(k)
        return real_generate(*args, k=k, **kwargs)

    def spy_load(spec, precision, *args, **kwargs):
        precisions.append((spec.name, precision))
        return real_load(spec, precision, *args, **kwargs)

    # bench and humaneval bind it at import; the perf runner imports it from generate when it first runs
    for module in (bench, humaneval, generate):
        monkeypatch.setattr(module, "measure_generation", spy_generate)
    monkeypatch.setattr(models, "load", spy_load)
    bench.run_bench(cfg, progress=False)
    runner = Runner(combo, load_pair(combo), settings)
    runner.round()
    humaneval.generate(he, Path(m.path).parent / "he.jsonl", task_ids=["HumanEval/0"], progress=False)
    assert {k for k in ks if k is not None} == {original.num_assistant_tokens}
    assert {p for name, p in precisions if name == "tiny-draft"} == {original.draft_precision}
    assert {p for name, p in precisions if name == "tiny-target"} == {original.target_precision}
    assert he.key()["num_assistant_tokens"] == original.num_assistant_tokens


# The registry's K, precisions, per-class choices and presets are read by the resolver alone.
REGISTRY_READS = {"num_assistant_tokens", "per_cpu_class", "preset", "reference_precision", "draft_vocab"}
RESOLVER = {ROOT / "harness/workload/selection.py", ROOT / "harness/workload/registry.py"}
OWNERS = {"sel", "selection", "request", "args", "config", "self"}  # names that hold a selection or a request


def _reads(path: Path, root: Path = ROOT) -> list[str]:
    """`x.ATTR` loads (and `x.preset(...)` calls) of the registry's selection values in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in REGISTRY_READS:
            owner = ast.unparse(node.value)
            if owner.split(".")[0] in OWNERS or ".selection" in owner:
                continue  # the selection's own fields, a request, the command line, a class's own property
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_downstream_of_the_resolver_reads_k_or_a_choice_from_the_registry():
    files = [p for d in ("harness", "benchmarks", "tests/accuracy", "tests/integration")
             for p in (ROOT / d).rglob("*.py") if p not in RESOLVER]
    offenders = [line for p in files for line in _reads(p)]
    assert not offenders, "read from the selection instead:\n" + "\n".join(offenders)


def test_the_rule_sees_a_planted_re_read(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def k(matrix, sel):\n    return sel.k or matrix.pair('p').num_assistant_tokens\n")
    assert _reads(planted, tmp_path) == ["planted.py:2: matrix.pair('p').num_assistant_tokens"]


def test_bench_runs_a_model_given_by_path_and_records_where_each_value_came_from(tiny, tmp_path):
    import json

    from test_cli import cli

    out = tmp_path / "r.json"
    target, draft = tiny.model("tiny-target").path, tiny.model("tiny-draft").path
    r = cli("--matrix", str(tiny.path), "bench", "--target", str(target), "--draft", str(draft), "--target-precision",
            "fp32", "--draft-precision", "fp32", "-k", "3", "--task", "benchmark", "--max-new-tokens", "6",
            "--limit", "1", "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert f"selection target+draft: target {target} fp32 (given), draft {draft} fp32 (given), K=3 (given)" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["pair"] == "target+draft" and doc["selection"]["origins"]["prompt_set"] == "task benchmark"
    assert doc["target"]["path"] == str(target) and doc["draft"]["precision"] == "fp32"
    r = cli("--matrix", str(tiny.path), "bench", "--target", str(target), "--no-progress")
    assert r.returncode != 0 and "give --target-precision or add defaults.target_precision" in r.stderr
