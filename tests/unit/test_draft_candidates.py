"""benchmarks/draft_candidates.py: tokens a step count what assisted generation keeps, a draft with
another tokenizer runs through transformers' generation across tokenizers, and the text stays the
target's greedy text, on tiny models."""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from bench_scripts import script_module
from tiny_models import VOCAB, perturbed, prompt, tiny_model, word_tokenizer

K, NEW = 4, 24


@dataclass
class Loaded:
    model: Any
    tokenizer: Any


@pytest.fixture(scope="module")
def dc():
    with script_module("draft_candidates") as module:
        yield module


def permuted(target: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
    """The target under another tokenizer: its word ids shuffled and 8 words added that the model
    never scores first (transformers crosses tokenizers only between vocabularies of
    different sizes). The same model otherwise, so every token it drafts must cross from one
    tokenizer to the other to be accepted."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    extra = 8
    order = torch.randperm(VOCAB - 3, generator=torch.Generator().manual_seed(1)) + 3
    new_id = {int(old): new for new, old in enumerate(order.tolist(), start=3)}
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{old}": new for old, new in new_id.items()},
             **{f"x{i}": VOCAB + i for i in range(extra)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    draft = copy.deepcopy(target)
    draft.resize_token_embeddings(VOCAB + extra)
    rows = torch.arange(VOCAB)
    for old, new in new_id.items():
        rows[new] = old
    with torch.no_grad():
        draft.get_input_embeddings().weight[:VOCAB] = target.get_input_embeddings().weight[rows]
        head = draft.get_output_embeddings().weight
        head[:VOCAB] = target.get_output_embeddings().weight[rows]
        head[VOCAB:] = 0.0  # logit 0: below the top of 93 words' logits spread around 0
    return draft, fast


def arms(dc, target: Loaded, draft: Loaded, ids: torch.Tensor):
    args = argparse.Namespace(k=K, max_new_tokens=NEW)
    plain = dc.run_arm("plain", target, None, ids, "p0", args)
    assisted = dc.run_arm("draft", target, dc.assisting(target, draft, K), ids, "p0", args)
    return plain, assisted, dc.summary("draft", [assisted], [plain])


def test_a_draft_that_is_the_target_keeps_every_drafted_token(dc):
    tok = word_tokenizer()
    model = tiny_model("llama", seed=0)
    target = Loaded(model, tok)
    plain, assisted, s = arms(dc, target, Loaded(copy.deepcopy(model), tok), prompt(length=12))
    assert plain.target_passes == NEW and plain.draft_ms == ()
    assert assisted.text == plain.text and s["equal_prompts"] == 1
    steps = -(-NEW // (K + 1))  # each step keeps K drafted tokens and the target's own
    assert assisted.target_passes == steps and s["tokens_per_step"] == pytest.approx(NEW / steps)
    assert s["draft_pass_ms"] > 0 and s["verify_ms"] > 0 and s["median_speedup"] > 0


def test_a_draft_with_another_tokenizer_crosses_to_the_target_s_tokens(dc):
    """The same model under a shuffled vocabulary agrees with the target word for word, so most
    drafted tokens are kept; a perturbed one keeps fewer; the text is the target's either way."""
    tok = word_tokenizer()
    model = tiny_model("llama", seed=0)
    target = Loaded(model, tok)
    ids = prompt(length=12)
    draft, other = permuted(model)
    plain, assisted, same = arms(dc, target, Loaded(draft, other), ids)
    assert assisted.text == plain.text and same["tokens_per_step"] > K - 1, same
    _, assisted, worse = arms(dc, target, Loaded(perturbed(draft, 0.5, seed=3), other), ids)
    assert assisted.text == plain.text and worse["tokens_per_step"] < same["tokens_per_step"] - 1, (same, worse)


def test_candidates_name_a_model_and_a_precision(dc):
    args = dc.parse_args(["--candidates", "a:w8af32-tensor, b"])
    assert args.candidate_list == [("a", "w8af32-tensor"), ("b", "bf16")]
    with pytest.raises(SystemExit):
        dc.parse_args(["-k", "0"])
