"""Decoding settings: what one `generate` call is asked to do, and the one place they are built.

Every caller (bench, the perf gate, HumanEval, the accuracy tests, benchmarks/) builds its
settings with `for_pair`, so a pair's registry values (K, schedule, confidence threshold) and
the sampling switches mean the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.core.registry import PairSpec

PROMPT_LOOKUP_NGRAM = 10  # transformers' max_matching_ngram_size for prompt-lookup decoding


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    num_assistant_tokens: int = 6  # K
    schedule: str = "constant"
    confidence_threshold: float = 0.0
    prompt_lookup_ngram: int = PROMPT_LOOKUP_NGRAM
    stop_sequences: tuple[str, ...] = ()


def for_pair(pair: PairSpec, *, max_new_tokens: int, fixed_length: bool = False, do_sample: bool = False,
             temperature: float | None = None, top_p: float | None = None, seed: int = 0,
             num_assistant_tokens: int | None = None, schedule: str | None = None,
             confidence_threshold: float | None = None, prompt_lookup_ngram: int = PROMPT_LOOKUP_NGRAM,
             stop_sequences: Sequence[str] = ()) -> DecodeSettings:
    """The pair's registry values, then what the caller gives (None: not given).

    fixed_length: exactly max_new_tokens new tokens (min = max), so every run does the same work.
    temperature and top_p apply only when sampling; greedy decoding ignores them (1.0)."""
    return DecodeSettings(
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens if fixed_length else 0,
        do_sample=do_sample,
        temperature=(1.0 if temperature is None else temperature) if do_sample else 1.0,
        top_p=(1.0 if top_p is None else top_p) if do_sample else 1.0,
        seed=seed,
        num_assistant_tokens=num_assistant_tokens or pair.num_assistant_tokens,
        schedule=schedule or pair.schedule,
        confidence_threshold=pair.confidence_threshold if confidence_threshold is None else confidence_threshold,
        prompt_lookup_ngram=prompt_lookup_ngram,
        stop_sequences=tuple(stop_sequences),
    )
