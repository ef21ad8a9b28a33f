"""Prompt lookup before the draft (--lookup-first, harness/workload/lookup_first.py): the lookup finds
the context's longest repeated end and proposes what followed its latest occurrence; in a real
assisted generation on tiny random models the output stays the target's own, the steps it takes
run no draft pass, and the draft's proposals on the other steps are exactly what a fresh draft
would propose from the accepted text (its KV cache caught up with the looked-up tokens)."""

from __future__ import annotations

import pytest
import torch

from harness.measure.generate import measure_generation
from harness.workload.decode import DecodeSettings
from harness.workload.lookup_first import continuation
from test_generate import replay_acceptance
from tiny_models import ARCHITECTURES, perturbed, tiny_model

K = 4


def found(ids: list[int], *, min_ngram: int = 1, max_ngram: int = 10, limit: int = 4) -> list[int] | None:
    out = continuation(torch.tensor(ids), min_ngram=min_ngram, max_ngram=max_ngram, limit=limit)
    return None if out is None else out.tolist()


def test_the_lookup_takes_the_longest_repeated_end_and_its_latest_occurrence():
    assert found([5, 6, 7, 8, 9, 5, 6, 7]) == [8, 9, 5, 6]                    # up to the limit
    assert found([5, 6, 7, 8, 9, 5, 6, 7], limit=9) == [8, 9, 5, 6, 7]        # up to the context's end
    assert found([1, 2, 3, 1, 2, 4, 9, 1, 2]) == [4, 9, 1, 2]                 # the latest of two occurrences
    assert found([7, 1, 2, 5, 3, 1, 2, 6, 7, 1, 2]) == [5, 3, 1, 2]           # 3 matching tokens beat a later 2
    assert found([7, 1, 2, 5, 3, 1, 2, 6, 7, 1, 2], max_ngram=2) == [6, 7, 1, 2]
    assert found([1, 2, 3, 9, 2, 4, 3]) == [9, 2, 4, 3]                        # one matching token
    assert found([1, 2, 3, 9, 2, 4, 3], min_ngram=2) is None                   # ... is not enough for 2
    assert found([4, 4, 4, 4]) == [4]                                           # a run: its latest earlier start
    assert found([1, 2, 3], limit=4) is None and found([1, 2, 1], limit=0) is None
    assert found([3]) is None


def count_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_lookup_steps_keep_the_targets_output_and_skip_the_draft(arch):
    target = tiny_model(arch, seed=0)
    draft = perturbed(target, 0.6, seed=3)
    # a prompt that repeats itself, so that the lookup has something to find from the first step on
    g = torch.Generator().manual_seed(5)
    span = torch.randint(3, 96, (1, 10), generator=g)
    ids = torch.cat([span, torch.randint(3, 96, (1, 4), generator=g), span[:, :6]], dim=1)
    settings = DecodeSettings(max_new_tokens=40, prompt_lookup_ngram=3)
    plain = measure_generation(target, ids, settings)
    draft_calls = count_forwards(draft)
    only_draft = measure_generation(target, ids, settings, mode="assisted", k=K, assistant=draft)
    draft_alone = draft_calls[0]
    first = DecodeSettings(max_new_tokens=40, prompt_lookup_ngram=3, lookup_first=2)
    r = measure_generation(target, ids, first, mode="assisted", k=K, assistant=draft)
    draft_with_lookup = draft_calls[0] - draft_alone

    assert r.tokens == plain.tokens == only_draft.tokens  # the target's own output, whoever proposed
    assert only_draft.lookup_per_step is None and len(r.lookup_per_step) == len(r.accepted_per_step)
    assert r.lookup_per_step[0] and sum(r.lookup_per_step) < len(r.lookup_per_step)  # both kinds of step ran
    lookup = lambda prefix, n: found(prefix, min_ngram=2, max_ngram=3, limit=n)  # noqa: E731
    assert r.accepted_per_step == replay_acceptance(r.tokens, draft, ids, K, r.lookup_per_step, lookup)
    assert draft_with_lookup < draft_alone  # a lookup step runs no draft pass
    drafted, accepted = r.draft_steps()  # what the acceptance by drafted position is made of
    assert len(drafted) == len(accepted) == len(r.lookup_per_step) - sum(r.lookup_per_step)


def test_sampled_decoding_with_lookup_steps_runs_and_is_reproducible():
    target = tiny_model("llama", seed=0)
    draft = perturbed(target, 0.6, seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 5, 6, 7]])
    settings = DecodeSettings(max_new_tokens=30, do_sample=True, temperature=0.7, seed=3, prompt_lookup_ngram=3,
                              lookup_first=2)
    a = measure_generation(target, ids, settings, mode="assisted", k=K, assistant=draft)
    b = measure_generation(target, ids, settings, mode="assisted", k=K, assistant=draft)
    assert a.lookup_per_step[0] and a.tokens == b.tokens and a.new_tokens == 30
