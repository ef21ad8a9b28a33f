"""A draft whose output layer scores only its N most frequent tokens (harness/workload/drafthead.py), on
tiny random models: the output stays the target's, only acceptance can fall."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.workload import drafthead
from harness.workload.decode import DecodeSettings
from harness.measure.generate import measure_generation
from tiny_models import VOCAB, prompt, tiny_model, word_tokenizer

K = 4
SETTINGS = DecodeSettings(max_new_tokens=40)


def test_the_subset_head_scores_the_kept_tokens_exactly_and_no_other():
    head = torch.nn.Linear(16, VOCAB)
    keep = torch.tensor([3, 5, 40, 90])
    sub = drafthead.SubsetHead(head, keep, VOCAB)
    h = torch.randn(2, 3, 16)
    out = sub(h)
    assert out.shape == (2, 3, VOCAB)
    # exactly the kept rows' linear layer; against the full head only the GEMM's blocking differs
    # (an AMD EPYC's fp32 kernel rounds a 4-wide and a VOCAB-wide output differently in the last bit)
    assert torch.equal(out[..., keep], torch.nn.functional.linear(h, head.weight[keep], head.bias[keep]))
    torch.testing.assert_close(out[..., keep], head(h)[..., keep], rtol=1e-5, atol=1e-6)
    others = torch.ones(VOCAB, dtype=torch.bool)
    others[keep] = False
    assert (out[..., others] == torch.finfo(out.dtype).min).all()


def test_ranking_puts_special_tokens_first_then_counts_then_ids():
    tok = word_tokenizer()
    ranked = drafthead.ranked_tokens(tok, VOCAB)
    assert sorted(ranked.tolist()) == list(range(VOCAB))
    assert set(ranked[:3].tolist()) == set(tok.all_special_ids)
    # the corpus has no 'wN' words: the rest keep id order
    assert ranked[3:].tolist() == sorted(ranked[3:].tolist())


def test_assisted_output_is_the_targets_and_acceptance_falls_outside_the_subset():
    target = tiny_model("llama", seed=0)
    ids = prompt(seed=1)
    plain = measure_generation(target, ids, SETTINGS)
    full = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=copy.deepcopy(target))
    small = copy.deepcopy(target)
    info = drafthead.restrict_head(small, word_tokenizer(), VOCAB // 2)
    assert info == {"draft_vocab": VOCAB // 2, "vocab": VOCAB}
    assisted = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=small)
    assert assisted.tokens == plain.tokens
    outside = [t for t in plain.tokens if t >= VOCAB // 2]  # the upper ids are not kept (ranked by id here)
    assert outside, "the test needs target tokens outside the subset"
    assert assisted.accepted / assisted.drafted < full.accepted / full.drafted  # the target's own copy


def test_a_vocabulary_the_model_cannot_take_is_a_clear_error():
    model = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match=f"draft vocabulary {VOCAB}: give 1..{VOCAB - 1}"):
        drafthead.restrict_head(model, word_tokenizer(), VOCAB)


def test_the_quantized_cache_keeps_a_restricted_draft_apart(tmp_path):
    from quant.cache import key

    (tmp_path / "config.json").write_text("{}")
    plain = key(tmp_path, "w8af32", {})
    assert key(tmp_path, "w8af32", {}, {"draft_vocab": 48, "vocab": VOCAB}) != plain
    assert key(tmp_path, "w8af32", {}, None) == plain
