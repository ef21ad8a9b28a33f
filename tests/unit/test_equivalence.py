"""Greedy equivalence triage on tiny random models: fp32 assisted == plain exactly; a draft whose
tokens the target accepts wrongly (verification patched to agree with the draft) fails, with the
position, both tokens and the gap; the near-tie rule excuses only tokens within epsilon of the top."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness.accuracy import equivalence as eq
from harness.workload.decode import DecodeSettings
from harness.measure.generate import measure_generation
from tiny_models import perturbed, prompt, tiny_model, word_tokenizer

K = 4
SETTINGS = DecodeSettings(max_new_tokens=24)


@contextlib.contextmanager
def verification_agrees_with_draft(target: torch.nn.Module):
    """The planted bug: in every multi-token forward (the verification of draft tokens), each position's
    logits are changed to predict the next input token, so every draft token is accepted."""
    def hook(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits = output.logits
        t = logits.shape[1]
        if ids is None or ids.shape[1] < 2 or t < 2:
            return output
        start = ids.shape[1] - t
        for j in range(t - 1):
            logits[0, j, ids[0, start + j + 1]] = logits[0, j].max() + 10.0
        return output

    handle = target.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", seed=0)
    return target, perturbed(target, 0.8, seed=5)


def run_triage(target, draft, plant: bool = False) -> list[eq.Triage]:
    out = []
    for i in range(4):
        ids = prompt(seed=i)
        plain = measure_generation(target, ids, SETTINGS).tokens
        with verification_agrees_with_draft(target) if plant else contextlib.nullcontext():
            assisted = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=draft).tokens
        out.append(eq.triage(target, f"p{i}", ids, plain, assisted, eq.EPSILON["fp32"], tokenizer=word_tokenizer()))
    return out


def test_fp32_assisted_is_exact(models):
    results = run_triage(*models)
    assert eq.counts(results) == {"exact": 4, "near-tie": 0, "failed": 0}, [r.describe() for r in results]


def test_wrongly_accepted_draft_fails_with_position_tokens_and_gap(models):
    results = run_triage(*models, plant=True)
    failed = [r for r in results if r.status == eq.FAILED]
    assert failed, "a draft accepted without verification must fail the equivalence check"
    text = failed[0].describe("w3 w4 w5")
    assert f"at new token {failed[0].position}" in text and str(failed[0].plain_token) in text
    assert str(failed[0].assisted_token) in text and "logit gap" in text and "prompt:" in text
    assert "failed" in eq.summary_line("tiny fp32", results)


def test_near_tie_rule(models):
    target, _ = models
    ids = prompt(seed=9)
    plain = measure_generation(target, ids, SETTINGS).tokens
    pos = 5
    logits = eq.next_token_logits(target, ids, plain[:pos])
    order = torch.argsort(logits, descending=True).tolist()
    assert order[0] == plain[pos]
    gap = float(logits[order[0]] - logits[order[1]])
    second = plain[:pos] + [order[1]]
    worst = plain[:pos] + [order[-1]]
    assert eq.triage(target, "x", ids, plain, second, epsilon=gap * 1.01).status == eq.NEAR_TIE
    assert eq.triage(target, "x", ids, plain, second, epsilon=gap * 0.99).status == eq.FAILED
    # the top two are close, but the assisted token is far below them: never a near-tie
    assert eq.triage(target, "x", ids, plain, worst, epsilon=gap * 1.01).status == eq.FAILED
    # equal tokens but different lengths is not a near-tie either
    r = eq.triage(target, "x", ids, plain, plain[:-3], epsilon=1e9)
    assert r.status == eq.FAILED and r.length_mismatch
