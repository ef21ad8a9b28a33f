"""Decoding settings: what one `generate` call is asked to do, besides K.

They are built in one place, `harness.workload.selection.resolve`, so a pair's registry values
(schedule, confidence threshold) and the sampling switches mean the same thing everywhere. K is
not here: it lives in the selection, and each generate call is given its own (bench sweeps it).
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN, ASSISTED, PROMPT_LOOKUP = "plain", "assisted", "prompt-lookup"  # the decoding modes
PROMPT_LOOKUP_NGRAM = 10  # transformers' max_matching_ngram_size for prompt-lookup decoding


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int
    min_new_tokens: int = 0     # max_new_tokens for a fixed length: every run does the same work
    do_sample: bool = False
    temperature: float = 1.0    # sampling only; greedy decoding ignores it (1.0)
    top_p: float = 1.0
    seed: int = 0
    schedule: str = "constant"  # transformers' num_assistant_tokens_schedule
    confidence_threshold: float = 0.0
    prompt_lookup_ngram: int = PROMPT_LOOKUP_NGRAM
    lookup_first: int = 0       # assisted: a context end of this many tokens seen before proposes what followed
    #                             it instead of the draft (harness/workload/lookup_first.py); 0: the draft always
    fused_draft: bool = False   # assisted, greedy: the draft runs in its fused loop (harness/workload/fused_draft.py)
    stop_sequences: tuple[str, ...] = ()
