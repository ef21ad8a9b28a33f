"""Lossless sampling on tiny random models: assisted sampling keeps the target's distribution
(temperature 1.0, and the reference's 0.1 with top-p 0.95, each at a prefix where the next token is a
real draw); a biased sampler fails the test at both settings."""

from __future__ import annotations

import pytest
import torch

from harness.accuracy import sampling
from harness.workload.decode import DecodeSettings
from test_equivalence import verification_agrees_with_draft
from tiny_models import prompt, tiny_model

N = 400


def peaked(model, scale: float = 12.0):
    """Random-init logits are nearly uniform over the vocabulary; scaling the output layer gives a
    distribution with a few likely tokens, as a trained model has (and a test with power)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def models():
    # the draft is an unrelated model: its proposals are often rejected, so a sampler that does not
    # correct for that (the planted bug below) visibly samples from the draft instead
    return peaked(tiny_model("llama", seed=0)), peaked(tiny_model("llama", seed=11))


def prefix_for(target, temperature, top_p):
    """The prompt, extended to a position where the next token is a real draw under these settings
    (at T=0.1 the prompt's own next token is 98% one token: a test there could not fail)."""
    s = DecodeSettings(max_new_tokens=2, do_sample=True, temperature=temperature, top_p=top_p)
    return sampling.contested_prefix(target, prompt(seed=3), s).ids, s


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.1, 0.95)])
def test_assisted_sampling_keeps_the_distribution(models, temperature, top_p):
    target, draft = models
    ids, s = prefix_for(target, temperature, top_p)
    plain = sampling.sample_tokens(target, ids, s, N, seed0=0)
    assisted = sampling.sample_tokens(target, ids, s, N, assistant=draft, k=4, seed0=10**6)
    result = sampling.compare("p3", plain, assisted, temperature=temperature, top_p=top_p)
    assert result.positions[0].dof >= 1, f"vacuous: one token only at the first position; {result.describe()}"
    assert result.passed, result.describe()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.1, 0.95)])
def test_biased_sampler_fails(models, temperature, top_p):
    """Planted bias: verification that accepts every draft token samples from the draft instead."""
    target, draft = models
    ids, s = prefix_for(target, temperature, top_p)
    plain = sampling.sample_tokens(target, ids, s, N, seed0=0)
    with verification_agrees_with_draft(target):
        biased = sampling.sample_tokens(target, ids, s, N, assistant=draft, k=4, seed0=10**6)
    result = sampling.compare("p3", plain, biased, temperature=temperature, top_p=top_p)
    assert not result.passed, result.describe()


def test_contested_prefix_finds_a_real_draw_at_low_temperature(models):
    target, _ = models
    start = prompt(seed=3)
    s = DecodeSettings(max_new_tokens=2, do_sample=True, temperature=0.1, top_p=0.95)
    assert sampling.next_token_probs(target, start, 0.1, 0.95).max() > 0.9  # the prompt itself: near-certain
    found = sampling.contested_prefix(target, start, s)
    assert torch.equal(found.ids[:, :start.shape[1]], start) and found.extended_by >= 1
    assert found.top[1][1] >= 0.1
    assert sampling.next_token_probs(target, found.ids, 0.1, 0.95)[found.top[1][0]] == pytest.approx(found.top[1][1])
    with pytest.raises(sampling.BadInputError, match="no position in 2 greedy steps"):
        sampling.contested_prefix(target, start, s, min_second=0.49, max_steps=2)


def test_homogeneity_pools_rare_tokens():
    chi2, dof, p, cols = sampling.homogeneity([1] * 50 + [2] * 50 + [3, 4], [1] * 50 + [2] * 50 + [5, 6])
    assert cols == 3 and p > 0.5  # the four rare tokens pooled into one column
    chi2, dof, p, cols = sampling.homogeneity([1] * 90 + [2] * 10, [1] * 10 + [2] * 90)
    assert p < 1e-10
