"""benchmarks/draft_stop.py: its table holds what the draft proposes at each position of the
target's text, and its replay of a stopping rule counts the steps, drafted and accepted tokens
that assisted generation with the fused draft loop counts (a constant K and a confidence threshold),
on tiny models."""

from __future__ import annotations


import pytest
import torch

from harness.measure.generate import measure_generation
from harness.workload.decode import DecodeSettings
from bench_scripts import script_module
from tiny_models import perturbed, prompt, tiny_model

K, NEW = 4, 24


@pytest.fixture(scope="module")
def draft_stop():
    with script_module("draft_stop") as module:
        yield module


@pytest.fixture(scope="module")
def models():
    target = tiny_model("qwen2", seed=0)
    draft = perturbed(target, 0.5, seed=3)
    with torch.no_grad():  # sharper logits, the same argmax: the drafted tokens' probabilities spread
        draft.model.norm.weight.mul_(20)
    return target, draft


def test_each_row_is_a_fresh_greedy_draft_from_that_position(draft_stop, models):
    target, draft = models
    ids = prompt(seed=1)
    text = draft_stop.target_text(target, ids, NEW, eos=set())
    rows = draft_stop.draft_rows(draft, ids, text, K, {})
    assert len(rows) == len(text) == NEW
    for i in (0, 5, NEW - 2):
        prefix = torch.cat([ids, torch.tensor([text[:i]], dtype=torch.long)], dim=1)
        out = draft.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=K, min_new_tokens=K,
                             do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        proposal = out.sequences[0, prefix.shape[1]:].tolist()
        assert rows[i]["tokens"] == proposal
        probs = [float(s[0].softmax(-1).max()) for s in out.scores]
        assert rows[i]["p"] == pytest.approx(probs, abs=1e-4)
        m = next((j for j, t in enumerate(proposal) if i + j >= NEW or t != text[i + j]), K)
        assert rows[i]["m"] == m and rows[i]["room"] == NEW - i - 1


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_the_replay_counts_what_assisted_generation_counts(draft_stop, models, threshold):
    target, draft = models
    ids = prompt(seed=1)
    text = draft_stop.target_text(target, ids, NEW, eos=set())
    rows = draft_stop.draft_rows(draft, ids, text, K, {})
    live = measure_generation(target, ids, DecodeSettings(max_new_tokens=NEW, fused_draft=True,
                                                          confidence_threshold=threshold),
                              mode="assisted", k=K, assistant=draft)
    assert live.tokens == text
    rule = draft_stop.Rule("confidence", K, threshold) if threshold else draft_stop.Rule("constant", K)
    cost = {"verify": {n: 10.0 for n in range(K + 1)}, "draft": {"pass": 1.0, "head": 0.5, "vocab": 100}}
    replayed = draft_stop.replay(rows, rule, draft_stop.Head(), cost)
    assert (replayed["steps"], replayed["drafted"], replayed["tokens"]) == (
        len(live.accepted_per_step), sum(live.drafted_per_step), NEW)
    assert replayed["ms"] == pytest.approx(10.0 * replayed["steps"] + replayed["drafted"])


def test_a_subset_that_misses_the_drafted_token_ends_the_accepted_run(draft_stop):
    row = {"m": 3, "room": 5, "tokens": [7, 8, 9, 1], "p": [0.9, 0.9, 0.9, 0.9],
           "subset": {"2": {"tokens": [7, 5, 9, 1], "p": [0.95, 0.95, 0.95, 0.95]},
                      "3": {"tokens": [7, 5, 9, 1], "p": [0.95, 0.4, 0.95, 0.95]}}}
    cost = {"verify": {n: 0.0 for n in range(5)}, "draft": {"pass": 1.0, "head": 0.5, "vocab": 4}}
    rule = draft_stop.Rule("constant", 4)
    full = draft_stop.replay([row], rule, draft_stop.Head(), cost)
    assert full["tokens"] == 4  # 3 accepted and the target's own
    cut = draft_stop.replay([row], rule, draft_stop.Head(2), cost)
    assert cut["tokens"] == 2  # the subset drafted 5 where the full layer had 8: one accepted
    # below the fallback the full layer's token is drafted: nothing lost, one pass pays for both layers
    fallback = draft_stop.replay([{**row, "subset": {"2": row["subset"]["3"]}}], rule, draft_stop.Head(2, 0.5), cost)
    assert fallback["tokens"] == 4 and fallback["fallbacks"] == 1
