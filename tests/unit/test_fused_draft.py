"""The fused draft loop (--fused-draft, harness/workload/fused_draft.py) computes what the draft model
computes: logits equal to transformers' forward over a prefill, single steps and a catch-up of
several tokens after dropping some, in float32 and with torch's dynamically quantized int8 layers
(w8af32-tensor, whose q/k/v and gate/up it packs together); inside assisted generation it proposes,
at every step, what a fresh greedy run of the draft proposes from the accepted text, and its
passes are timed as the draft's."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from harness.core.errors import HarnessError
from harness.measure.generate import measure_generation
from harness.workload import registry
from harness.workload.decode import DecodeSettings
from harness.workload.fused_draft import FusedDraft, fuse
from harness.perf.combinations import Combination, PerfSettings, combinations
from harness.workload.selection import Request, resolve
from test_generate import replay_acceptance
from tiny_models import counted_prepacks, perturbed, prompt, tiny_model, write_local_matrix

FUSED = ("llama", "qwen2")
K = 4


def w8af32_tensor(model: torch.nn.Module) -> torch.nn.Module:
    """The suite's w8af32-tensor draft precision: torch's dynamic int8 layers, per-channel weight scales."""
    import quant

    model, _ = quant.quantize(copy.deepcopy(model), "w8af32-tensor", progress=False)
    return model.eval()


def hf_logits(model, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """The last position's logits, as generate asks for them (logits_to_keep=1: with per-tensor
    activation scales the output layer's input range is that position's alone)."""
    return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()


@pytest.mark.parametrize("precision", ["fp32", "w8af32-tensor"])
@pytest.mark.parametrize("arch", FUSED)
def test_the_fused_loop_computes_the_models_logits(arch, precision):
    model = tiny_model(arch, seed=4)
    with torch.no_grad():  # norm weights away from their initial ones: a norm that drops its weight shows
        torch.manual_seed(5)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.mul_(torch.rand_like(param) + 0.5)
    if precision != "fp32":
        model = w8af32_tensor(model)
    loop = FusedDraft(model, capacity=16)  # small: the cache must grow on the way
    ids = prompt(seed=2, length=12)
    tol = dict(rtol=1e-4, atol=1e-4)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        torch.testing.assert_close(loop(ids), hf_logits(model, ids, cache), **tol)
        fed = ids[0].tolist()
        for token in (5, 17, 9, 30, 41, 7):  # single steps past the first capacity
            fed.append(token)
            torch.testing.assert_close(loop(torch.tensor([[token]])), hf_logits(model, torch.tensor([[token]]), cache),
                                       **tol)
        # drop the last three tokens and feed three others at once (a verification's catch-up)
        loop.length = len(fed) - 3
        cache.crop(-3)
        block = torch.tensor([[11, 12, 13]])
        torch.testing.assert_close(loop(block), hf_logits(model, block, cache), **tol)
        assert loop.length == len(fed) == cache.get_seq_length()


def test_packed_int8_layers_compute_exactly_what_the_separate_ones_do():
    model = w8af32_tensor(tiny_model("qwen2", seed=4))
    attn = model.model.layers[0].self_attn
    parts = [attn.q_proj, attn.k_proj, attn.v_proj]
    packed = fuse(parts)
    assert type(packed).__name__ == "_Int8Op"  # packed together, not called one by one
    x = torch.randn(3, 64)
    assert torch.equal(packed(x), torch.cat([p(x) for p in parts], dim=-1))


def test_a_draft_loaded_from_its_checkpoint_packs_each_weight_once_for_the_loop(monkeypatch, tmp_path):
    """A draft's layers restored from a quantized checkpoint are packed when first needed: q, k, v
    and gate, up only together by the loop, not also one by one on load (packing is most of a
    worker's start on an AVX2 host); the loop still computes the model's logits."""
    import quant

    float_model = tiny_model("qwen2", seed=4)
    model, record = quant.quantize(copy.deepcopy(float_model), "w8af32-tensor", progress=False)
    quant.save(model, record, tmp_path / "draft.pt")
    packed = counted_prepacks(monkeypatch)
    loaded, _ = quant.load(copy.deepcopy(float_model), tmp_path / "draft.pt")
    loop = FusedDraft(loaded.eval(), capacity=16)
    monkeypatch.undo()
    weights = sum(m.weight.numel() for m in float_model.modules() if isinstance(m, torch.nn.Linear))
    assert sum(packed) <= weights + 2 * record.layers  # each weight once, beside 1x1 placeholders
    ids = prompt(seed=2, length=12)
    with torch.inference_mode():
        expected = hf_logits(model.eval(), ids, DynamicCache(config=model.config))
        torch.testing.assert_close(loop(ids), expected, rtol=1e-4, atol=1e-4)
        # the model's own layers, never packed by the loop, pack on their first call
        assert torch.equal(hf_logits(loaded, ids, DynamicCache(config=loaded.config)), expected)


@pytest.mark.parametrize("arch", FUSED)
def test_in_assisted_generation_it_proposes_what_the_draft_proposes(arch):
    target = tiny_model(arch, seed=0)
    # float32: with int8 activations quantized per tensor, a rounding-level difference in one input can
    # move a quantization step and flip a near-tie between two draft tokens now and then (the logits
    # test above holds the int8 loop to the model within 1e-4)
    draft = perturbed(target, 0.5, seed=3)
    ids = prompt(seed=1)
    settings = DecodeSettings(max_new_tokens=40)
    plain = measure_generation(target, ids, settings)
    fused = measure_generation(target, ids, DecodeSettings(max_new_tokens=40, fused_draft=True), mode="assisted",
                               k=K, assistant=draft)
    assert fused.tokens == plain.tokens
    # at every step, the proposals of a fresh greedy draft from the accepted text: the cache kept
    # exactly what it shared with the text
    assert fused.accepted_per_step == replay_acceptance(fused.tokens, draft, ids, K)
    assert sum(fused.accepted_per_step) > 0
    # its passes are timed as the draft's: the prompt once, then one pass per drafted token (the first
    # step's come before the target's first pass, outside the decode phase)
    assert fused.phases["draft_prefill"].calls == 1
    assert fused.phases["draft_step"].calls == sum(fused.drafted_per_step[1:])


def replay_confident(target_tokens: list[int], draft, prompt_ids: torch.Tensor, k: int,
                     threshold: float) -> tuple[list[int], list[int]]:
    """Drafted and accepted tokens per step, rebuilt from the final tokens: from the accepted text
    the draft proposes greedily until a token whose probability is below `threshold` (included) or K."""
    pos, drafted, accepted = 0, [], []
    while pos < len(target_tokens):
        prefix = torch.cat([prompt_ids, torch.tensor([target_tokens[:pos]], dtype=torch.long)], dim=1)
        proposal = []
        for _ in range(min(k, len(target_tokens) - pos - 1)):
            with torch.no_grad():
                p = draft(prefix).logits[0, -1].float().softmax(-1)
            token = int(p.argmax())
            proposal.append(token)
            prefix = torch.cat([prefix, torch.tensor([[token]])], dim=1)
            if float(p[token]) < threshold:
                break
        m = 0
        while m < len(proposal) and proposal[m] == target_tokens[pos + m]:
            m += 1
        drafted.append(len(proposal))
        accepted.append(m)
        pos += m + 1
    return drafted, accepted


@pytest.mark.parametrize("threshold", [0.35, 0.5])
def test_with_a_confidence_threshold_a_step_ends_after_the_first_unsure_token(threshold):
    target = tiny_model("qwen2", seed=0)
    draft = perturbed(target, 0.5, seed=3)
    with torch.no_grad():  # sharper logits, the same argmax: its top tokens' probabilities spread over 0.2-0.9
        draft.model.norm.weight.mul_(20)
    ids = prompt(seed=1)
    plain = measure_generation(target, ids, DecodeSettings(max_new_tokens=40))
    sure = measure_generation(target, ids, DecodeSettings(max_new_tokens=40, fused_draft=True,
                                                          confidence_threshold=threshold),
                              mode="assisted", k=K, assistant=draft)
    assert sure.tokens == plain.tokens
    drafted, accepted = replay_confident(sure.tokens, draft, ids, K, threshold)
    assert (sure.drafted_per_step, sure.accepted_per_step) == (drafted, accepted)
    # some steps stopped early (not at K or the text's end), some drafted on past a confident token
    assert 0 < sum(d < K for d in drafted[:-1]) and max(drafted) > 1


def test_it_runs_behind_the_prompt_lookup_too():
    target = tiny_model("llama", seed=0)
    draft = perturbed(target, 0.5, seed=3)
    ids = torch.cat([prompt(seed=1, length=10), prompt(seed=1, length=6)], dim=1)  # repeats itself
    settings = DecodeSettings(max_new_tokens=40, prompt_lookup_ngram=3, lookup_first=2, fused_draft=True)
    plain = measure_generation(target, ids, DecodeSettings(max_new_tokens=40))
    both = measure_generation(target, ids, settings, mode="assisted", k=K, assistant=draft)
    assert both.tokens == plain.tokens and both.lookup_per_step[0] and not all(both.lookup_per_step)


def test_an_architecture_it_cannot_run_is_named():
    with pytest.raises(ValueError, match="runs llama, qwen2 models; this draft is 'opt'"):
        FusedDraft(tiny_model("opt", seed=0))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return registry.load_matrix(write_local_matrix(tmp_path_factory.mktemp("tiny")))


@pytest.mark.parametrize("request_, allowed", [
    (Request(pair="tiny+draft", fused_draft=True, do_sample=True), "drafts greedily; drop --do-sample"),
    (Request(pair="tiny+draft", fused_draft=True, schedule="heuristic"), "constant K tokens a step; drop --schedule"),
    (Request(pair="tiny+lookup", fused_draft=True), "this run has none"),
])
def test_what_the_loop_cannot_serve_is_one_line_naming_the_option(tiny, request_, allowed):
    with pytest.raises(HarnessError) as info:
        resolve(tiny, request_)
    message = str(info.value)
    assert message.startswith("--fused-draft") and allowed in message and "\n" not in message, message
    ok = resolve(tiny, Request(pair="tiny+draft", fused_draft=True))
    assert ok.decode.fused_draft and ok.origin("fused_draft") == "given" and ok.as_values()["fused_draft"]
    assert not resolve(tiny, Request(pair="tiny+draft")).decode.fused_draft
    sure = resolve(tiny, Request(pair="tiny+draft", fused_draft=True, confidence_threshold=0.4))
    assert sure.decode.fused_draft and sure.decode.confidence_threshold == 0.4



def test_a_preset_chooses_it_for_greedy_runs_and_a_run_it_cannot_serve_drafts_through_transformers():
    amd = registry.load_matrix(registry.DEFAULT_MATRIX, cpu_class="avx512-bf16")
    fastest = resolve(amd, Request(preset="fastest", check_here=False))
    assert (fastest.target.precision, fastest.draft.precision, fastest.k, fastest.reference_precision) == (
        "w8af32", "w8af32-tensor", 12, "bf16")
    assert fastest.decode.confidence_threshold == 0.7 and fastest.origin("confidence_threshold") == "preset fastest"
    assert fastest.decode.fused_draft and fastest.origin("fused_draft") == "preset fastest"
    sampled = resolve(amd, Request(preset="fastest", do_sample=True, check_here=False))
    assert not sampled.decode.fused_draft and "fused_draft" not in sampled.origins
    assert not resolve(amd, Request(preset="fastest", schedule="heuristic", check_here=False)).decode.fused_draft
    off = resolve(amd, Request(preset="fastest", fused_draft=False, check_here=False))
    assert not off.decode.fused_draft and off.origin("fused_draft") == "given"
    # the class's own choice (make bench, the merge gate) drafts with the fused loop too, but a sampled
    # run of it drafts through transformers and keeps the class's threshold
    chosen_sampled = resolve(amd, Request(do_sample=True, check_here=False)).decode
    assert resolve(amd, Request(check_here=False)).decode.fused_draft
    assert not chosen_sampled.fused_draft and chosen_sampled.confidence_threshold == 0.6


def test_the_perf_gates_worker_runs_what_the_preset_chose():
    """The A/B gate's worker resolves a combination from its request, with no preset: the fused loop
    and the confidence threshold a preset chose travel as values."""
    amd = registry.load_matrix(registry.DEFAULT_MATRIX, cpu_class="avx512-bf16")
    fastest = next(c for c in combinations(amd) if c.selection.preset and c.selection.preset.name == "fastest")
    again = Combination.from_request(amd, fastest.as_request(), PerfSettings.from_matrix(amd))
    assert again.selection.decode == fastest.selection.decode and again.selection.decode.fused_draft
    assert again.id == fastest.id
    request = fastest.as_request()
    assert request["fused_draft"] is True and request["confidence_threshold"] == 0.7
    # a combination that uses neither sends neither: a worker of a commit from before them still loads it
    avx512 = registry.load_matrix(registry.DEFAULT_MATRIX, cpu_class="avx512")
    chosen = next(c for c in combinations(avx512) if c.selection.preset is None and c.pair == fastest.pair)
    assert "fused_draft" not in chosen.as_request() and "confidence_threshold" not in chosen.as_request()
    assert Combination.from_request(avx512, chosen.as_request(), PerfSettings.from_matrix(avx512)).selection.decode == (
        chosen.selection.decode)
    # the avx512-bf16 class's own choice sends both, and its worker runs what the class chose
    zen4 = next(c for c in combinations(amd) if c.selection.preset is None and c.pair == fastest.pair)
    assert (zen4.as_request()["fused_draft"], zen4.as_request()["confidence_threshold"]) == (True, 0.6)
    assert Combination.from_request(amd, zen4.as_request(), PerfSettings.from_matrix(amd)).selection.decode == (
        zen4.selection.decode)


def test_the_gate_power_benchmarks_measure_what_the_merge_gate_runs():
    """benchmarks/ab_power.py and gate_power.py resolve the pair as the merge gate's [perf] line does:
    the class's K and its drafting choices (the fused loop, the confidence threshold), under the same
    id; and two combinations that draft differently never share an id."""
    from bench_scripts import script_module

    amd = registry.load_matrix(registry.DEFAULT_MATRIX, cpu_class="avx512-bf16")
    settings = PerfSettings.from_matrix(amd)
    gated = next(c for c in combinations(amd) if c.selection.preset is None and c.pair == "qwen-coder-1.5b+0.5b"
                 and c.decoding == "greedy" and c.platform == "cpu" and not c.slow)
    with script_module("ab_power") as ab_power:
        measured = ab_power.combination(amd, gated.pair, settings)
    assert (measured.id, measured.selection.decode, measured.k) == (gated.id, gated.selection.decode, gated.k)
    assert measured.selection.decode.fused_draft and measured.id.endswith(":k16:fused:c0.6")
    with script_module("gate_power") as gate_power:
        args = gate_power.parse_args(["--pair", gated.pair])
        assert gate_power.combination(amd, args, settings).id == gated.id
    unfused = Combination.from_request(amd, {**gated.as_request(), "fused_draft": False, "confidence_threshold": 0.0},
                                       settings)
    assert unfused.k == gated.k and unfused.id == gated.id.removesuffix(":fused:c0.6")
