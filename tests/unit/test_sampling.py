"""Lossless sampling on tiny random models: assisted sampling keeps the target's distribution
(temperature 1.0, and the reference's 0.1 with top-p 0.95); a biased sampler fails the test."""

from __future__ import annotations

import pytest
import torch

from harness import sampling
from harness.generate import DecodeSettings
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


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.1, 0.95)])
def test_assisted_sampling_keeps_the_distribution(models, temperature, top_p):
    target, draft = models
    ids = prompt(seed=3)
    s = DecodeSettings(max_new_tokens=2, do_sample=True, temperature=temperature, top_p=top_p, num_assistant_tokens=4)
    plain = sampling.sample_tokens(target, ids, s, N, seed0=0)
    assisted = sampling.sample_tokens(target, ids, s, N, assistant=draft, seed0=10**6)
    result = sampling.compare("p3", plain, assisted, temperature=temperature, top_p=top_p)
    assert result.passed, result.describe()


def test_biased_sampler_fails(models):
    """Planted bias: verification that accepts every draft token samples from the draft instead."""
    target, draft = models
    ids = prompt(seed=3)
    s = DecodeSettings(max_new_tokens=2, do_sample=True, temperature=1.0, num_assistant_tokens=4)
    plain = sampling.sample_tokens(target, ids, s, N, seed0=0)
    with verification_agrees_with_draft(target):
        biased = sampling.sample_tokens(target, ids, s, N, assistant=draft, seed0=10**6)
    result = sampling.compare("p3", plain, biased, temperature=1.0, top_p=1.0)
    assert not result.passed, result.describe()


def test_homogeneity_pools_rare_tokens():
    chi2, dof, p, cols = sampling.homogeneity([1] * 50 + [2] * 50 + [3, 4], [1] * 50 + [2] * 50 + [5, 6])
    assert cols == 3 and p > 0.5  # the four rare tokens pooled into one column
    chi2, dof, p, cols = sampling.homogeneity([1] * 90 + [2] * 10, [1] * 10 + [2] * 90)
    assert p < 1e-10
