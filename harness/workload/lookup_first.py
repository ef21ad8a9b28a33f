"""Prompt lookup before the draft (`--lookup-first N`): where the context ends with a span of at
least N tokens that occurred earlier in it, the tokens that followed that earlier occurrence are
this step's candidates, and the draft model is not run; elsewhere the draft drafts as usual.

A lookup step costs one verification pass and no draft steps, so it pays where copied spans are
long: code that repeats a signature, a name or a line of the prompt. The target verifies every
candidate, so the output is the target's own whichever proposed it (greedy: the same tokens as
plain decoding; sampled: lookup candidates carry no draft probabilities, so the target samples each
position and keeps candidates while they agree, as transformers' prompt-lookup decoding does).

The draft's KV cache needs no care here: transformers' draft generator crops its cache to the
accepted tokens and feeds every token it has not seen on its next call, so a step the lookup took
only means that the next draft call starts with a few more tokens to read. Only the draft's very
first call, when lookup steps came before it, needs its attention mask and positions extended.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.candidate_generator import (CandidateGenerator, _prepare_attention_mask,
                                                         _prepare_position_ids, _prepare_token_type_ids)

LOOKUP, DRAFT = "lookup", "draft"  # where one step's candidates came from


def continuation(ids: torch.Tensor, *, min_ngram: int, max_ngram: int, limit: int) -> torch.Tensor | None:
    """Up to `limit` tokens that followed the most recent earlier occurrence of the context's
    longest matching end (between max_ngram and min_ngram tokens); None when no end of at least
    min_ngram tokens occurred before. `ids`: one sequence, shape (n,)."""
    n = ids.shape[0]
    if limit <= 0:
        return None
    for size in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        # windows starting at 0 .. n-size-1: every earlier occurrence, the end itself excluded
        windows = ids[:-1].unfold(0, size, 1)
        starts = (windows == ids[n - size:]).all(dim=1).nonzero().flatten()
        if starts.numel():
            begin = int(starts[-1]) + size  # the most recent occurrence: nearby text predicts best
            return ids[begin:begin + limit]
    return None


class LookupFirst(CandidateGenerator):
    """Candidates from the context where it repeats itself, else from the draft's generator."""

    def __init__(self, draft: Any, *, min_ngram: int, max_ngram: int, eos_token_id: torch.Tensor | None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"lookup-first: min_ngram {min_ngram} must be 1..{max_ngram}")
        self.draft, self.min_ngram, self.max_ngram = draft, min_ngram, max_ngram
        self.eos_token_id = eos_token_id
        self.sources: list[str] = []  # one per step: LOOKUP or DRAFT

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs: Any) -> tuple[torch.LongTensor, Any]:
        # as many as the draft would propose now, and room for the target's own token
        room = min(int(self.draft.num_assistant_tokens), self.draft.main_model_max_length - input_ids.shape[1] - 1)
        found = continuation(input_ids[0], min_ngram=self.min_ngram, max_ngram=self.max_ngram, limit=room)
        if found is not None and self.eos_token_id is not None:
            # the target must end the text itself: candidates stop before an end-of-sequence token
            ends = torch.isin(found, self.eos_token_id.to(found.device)).nonzero()
            found = found[:int(ends[0])] if ends.numel() else found
        if found is not None and found.numel():
            self.sources.append(LOOKUP)
            return torch.cat([input_ids, found[None].to(input_ids.device)], dim=1), None
        self.sources.append(DRAFT)
        kwargs_ = getattr(self.draft, "assistant_kwargs", None)  # transformers' generator (the fused loop has none)
        if kwargs_ is not None and kwargs_.get("past_key_values") is None:
            # the draft's first call comes after lookup steps: its attention mask and position ids still
            # have the prompt's length (the generator extends them only once it has a cache), so they
            # are extended here as the generator does it
            n = input_ids.shape[-1]
            kwargs_ = _prepare_attention_mask(kwargs_, n, self.draft.assistant_model.config.is_encoder_decoder)
            kwargs_ = _prepare_position_ids(kwargs_, n, self.draft.assistant_model.config.is_encoder_decoder)
            self.draft.assistant_kwargs = _prepare_token_type_ids(kwargs_, n)
        return self.draft.get_candidates(input_ids, **kwargs)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        # the draft's schedule and confidence statistics learn from its own steps only
        if self.sources and self.sources[-1] == DRAFT:
            self.draft.update_candidate_strategy(input_ids, scores, num_matches)
