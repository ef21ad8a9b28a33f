"""One measured generation: wall/CPU timings, the tokens, and the decoding loop's own counters.

`measure_generation` runs one `generate` call (batch size 1) and returns a GenerationResult
(harness/measure/record.py, where every metric is defined). The counters come from the
assisted-decoding loop itself: the candidate generator that transformers builds for the call is
wrapped, so `get_candidates` reports what was drafted and `update_candidate_strategy` reports
n_matches; every forward pass of both models is timed and filed under its phase
(harness/measure/phases.py). Logits processors are never used for this: they run several times per verification step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from harness.core import timing
from harness.measure import phases
from harness.workload.decode import ASSISTED, PLAIN, PROMPT_LOOKUP, DecodeSettings
from harness.workload.fused_draft import FusedDraftGenerator, fused
from harness.workload.lookup_first import LOOKUP, LookupFirst
from harness.measure.record import GenerationResult



def decode_metrics(total_s: float, prefill_s: float, new_tokens: int,
                   first_step_tokens: int) -> tuple[float | None, float | None]:
    """(time_per_token_ms, tokens_per_sec) of the decode phase; None when it produced no token."""
    decode_tokens = new_tokens - first_step_tokens
    if decode_tokens <= 0:
        return None, None
    per_token_ms = (total_s - prefill_s) * 1000.0 / decode_tokens
    return per_token_ms, (1000.0 / per_token_ms if per_token_ms > 0 else None)


class StopOnSequences(StoppingCriteria):
    """Stops when the decoded new text contains a stop sequence. Works with and without a draft
    (transformers' `generate(stop_strings=...)` fails with a draft model: the assistant's own generate
    call gets the stop strings without a tokenizer)."""

    def __init__(self, tokenizer: Any, prompt_len: int, stops: Sequence[str]):
        self.tokenizer, self.prompt_len, self.stops = tokenizer, prompt_len, tuple(stops)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        text = self.tokenizer.decode(input_ids[0, self.prompt_len:], skip_special_tokens=True)
        done = any(stop in text for stop in self.stops)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class ForcedLength(LogitsProcessor):
    """A fixed length for greedy decoding: the EOS ids are masked in a copy of the scores until `min_new_tokens` new
    tokens stand; the scores equal transformers' MinNewTokensLengthLogitsProcessor's. That one (with
    MinLengthLogitsProcessor beside it) builds a vocabulary-sized arange, isin, clone and where at
    every call, and an assisted step calls them at every verified position: host work that no
    deployment without a minimum length pays, measured in docs/bench.md ("A fixed length")."""

    def __init__(self, prompt_len: int, min_new_tokens: int, eos_ids: torch.Tensor):
        self.prompt_len, self.min_new_tokens, self.eos_ids = prompt_len, min_new_tokens, eos_ids
        # the ids within each vocabulary, on each device: made once, so that a call on a GPU waits for nothing
        self._ids: dict[tuple[torch.device, int], torch.Tensor] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] - self.prompt_len >= self.min_new_tokens:
            return scores
        key = (scores.device, scores.shape[-1])
        if key not in self._ids:  # an id outside this vocabulary masks nothing
            self._ids[key] = self.eos_ids[self.eos_ids < scores.shape[-1]].to(scores.device)
        return scores.index_fill(-1, self._ids[key], float("-inf"))


def _forced_length(target: torch.nn.Module, settings: DecodeSettings, prompt_len: int) -> LogitsProcessorList | None:
    """The fixed length as ForcedLength for greedy decoding, where the scores' argmax is all that
    counts. Sampled decoding keeps transformers' processors: transformers' draft loop gets the
    target's processors and appends one of a kind it does not make itself after its own top-p
    warper, and masking after top-p would change the draft's distribution."""
    eos_ids = _eos_ids(target)
    if settings.do_sample or not settings.min_new_tokens or eos_ids is None:
        return None
    return LogitsProcessorList([ForcedLength(prompt_len, settings.min_new_tokens, eos_ids)])


@dataclass
class _LoopCounters:
    drafted_per_step: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    lookup_per_step: list[bool] | None = None  # --lookup-first: whether the lookup, not the draft, proposed


@contextlib.contextmanager
def _instrumented(target: torch.nn.Module, assistant: torch.nn.Module | None, counters: _LoopCounters,
                  timer: phases.PassTimer, settings: DecodeSettings, k: int | None) -> Iterator[None]:
    """Time (or on a GPU count) the target's and the draft's forward passes, and wrap the candidate
    generator so that its calls report what was drafted and accepted; with --fused-draft the draft
    runs in its fused loop (harness/workload/fused_draft.py), with --lookup-first behind a prompt
    lookup (harness/workload/lookup_first.py)."""
    handles = timer.attach(target, "target")
    if assistant is not None:  # the draft's passes: the model's, or with --fused-draft the fused loop's
        handles += timer.attach(fused(assistant) if settings.fused_draft else assistant, "draft")
    build = target._get_candidate_generator

    def build_counting(*args: Any, **kwargs: Any) -> Any:
        generator = build(*args, **kwargs)
        if settings.fused_draft and assistant is not None:
            generator = FusedDraftGenerator(fused(assistant), k=k,
                                            max_length=generator.main_model_max_length, eos_token_id=_eos_ids(target),
                                            confidence=settings.confidence_threshold)
        if settings.lookup_first and assistant is not None:
            generator = LookupFirst(generator, min_ngram=settings.lookup_first,
                                    max_ngram=max(settings.prompt_lookup_ngram, settings.lookup_first),
                                    eos_token_id=_eos_ids(target))
            counters.lookup_per_step = []
        lookup_first = generator if isinstance(generator, LookupFirst) else None
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def counting_get_candidates(input_ids: torch.LongTensor, *a: Any, **kw: Any) -> Any:
            candidates, logits = get_candidates(input_ids, *a, **kw)
            counters.drafted_per_step.append(int(candidates.shape[1] - input_ids.shape[1]))
            if lookup_first is not None:
                counters.lookup_per_step.append(lookup_first.sources[-1] == LOOKUP)
            return candidates, logits

        def counting_update(input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> Any:
            counters.accepted_per_step.append(int(num_matches))
            return update(input_ids, scores, num_matches)

        generator.get_candidates = counting_get_candidates
        generator.update_candidate_strategy = counting_update
        return generator

    target._get_candidate_generator = build_counting
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        del target._get_candidate_generator  # the instance attribute; the class method is back


def _eos(target: torch.nn.Module) -> int | list[int] | None:
    """The target's end-of-sequence token(s): its generation config's, else its model config's."""
    eos = target.generation_config.eos_token_id
    return target.config.eos_token_id if eos is None else eos


def _eos_ids(target: torch.nn.Module) -> torch.Tensor | None:
    eos = _eos(target)
    return None if eos is None else torch.tensor(eos if isinstance(eos, list) else [eos])


def reset_assistant(assistant: torch.nn.Module, settings: DecodeSettings, k: int) -> None:
    """transformers keeps the adaptive K and confidence threshold on the assistant's generation
    config from one call to the next; every measured run starts from the configured values."""
    gc = assistant.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = settings.schedule
    gc.assistant_confidence_threshold = settings.confidence_threshold


def generation_config(target: torch.nn.Module, settings: DecodeSettings, mode: str,
                      k: int | None = None, forced_length: bool = False) -> GenerationConfig:
    """A complete, explicit config: nothing is inherited from the checkpoint's sampling defaults.
    `forced_length`: ForcedLength holds the run to its length, so the config sets no minimum (a
    minimum length of 0, not None: generate fills what is None from the checkpoint's config)."""
    base = target.generation_config
    eos = _eos(target)
    pad = base.pad_token_id if base.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    gc = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=None if forced_length else settings.min_new_tokens or None,
        min_length=0 if forced_length else None,
        do_sample=settings.do_sample,
        temperature=settings.temperature if settings.do_sample else None,
        top_p=settings.top_p if settings.do_sample else None,
        top_k=0 if settings.do_sample else None,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=base.bos_token_id,
        use_cache=True,
    )
    if mode == PROMPT_LOOKUP:
        gc.prompt_lookup_num_tokens = k
        gc.max_matching_ngram_size = settings.prompt_lookup_ngram
    return gc


def measure_generation(
    target: torch.nn.Module,
    input_ids: torch.LongTensor,
    settings: DecodeSettings,
    *,
    mode: str = PLAIN,
    k: int | None = None,
    assistant: torch.nn.Module | None = None,
    tokenizer: Any = None,
) -> GenerationResult:
    """Run one `generate` (batch size 1) and measure it; `k`: the tokens drafted (or looked up)
    per step, for the assisted modes only (a selection's K: harness/workload/selection.py)."""
    if mode not in (PLAIN, ASSISTED, PROMPT_LOOKUP):
        raise ValueError(f"mode must be one of plain, assisted, prompt-lookup; got {mode!r}")
    if (mode != PLAIN) != (k is not None):
        raise ValueError(f"K is given for the assisted modes, and only for them (mode {mode!r}, k {k!r})")
    if (mode == ASSISTED) != (assistant is not None):
        raise ValueError("an assistant model is needed for mode 'assisted', and only for it")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape (1, prompt_len); got {tuple(input_ids.shape)}")
    input_ids = input_ids.to(target.device)
    prompt_len = input_ids.shape[1]
    forced = _forced_length(target, settings, prompt_len)
    kwargs: dict[str, Any] = {"generation_config": generation_config(target, settings, mode, k,
                                                                     forced_length=forced is not None)}
    if forced is not None:
        kwargs["logits_processor"] = forced
    if assistant is not None:
        reset_assistant(assistant, settings, k)
        kwargs["assistant_model"] = assistant
    if settings.stop_sequences:
        if tokenizer is None:
            raise ValueError("stop sequences need the tokenizer")
        kwargs["stopping_criteria"] = StoppingCriteriaList([StopOnSequences(tokenizer, prompt_len, settings.stop_sequences)])

    counters = _LoopCounters()
    clock = timing.device_clock(input_ids.device)  # on CUDA each read waits for the queued work
    timer = phases.PassTimer(clock, timed=clock is time.perf_counter,  # per pass only where a read waits for nothing
                             cpu_clock=time.thread_time)
    torch.manual_seed(settings.seed)
    with _instrumented(target, assistant, counters, timer, settings, k), torch.inference_mode():
        cpu0, t0 = time.process_time(), clock()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        t1, cpu1 = clock(), time.process_time()

    prefill_end = timer.first_target_end if timer.first_target_end is not None else t1
    split = phases.split(timer.calls, prefill_end, t1) if timer.timed else None
    return _result(mode, prompt_len, out[0, prompt_len:].tolist(), t1 - t0, cpu1 - cpu0, prefill_end - t0,
                   timer.target_passes, counters, split)


def _result(mode: str, prompt_len: int, tokens: list[int], total_s: float, cpu_s: float, prefill_s: float,
            target_forwards: int, counters: _LoopCounters,
            split: dict[str, phases.PhaseCost] | None) -> GenerationResult:
    """The record of one call: timings, tokens, the phases and (assisted) the loop's per-step counters."""
    new_tokens = len(tokens)
    result = GenerationResult(
        mode=mode, prompt_tokens=prompt_len, new_tokens=new_tokens, total_s=total_s,
        prefill_ms=prefill_s * 1000.0, time_per_token_ms=None, tokens_per_sec=None,
        cpu_s=cpu_s, target_forwards=target_forwards, tokens=tokens, phases=split,
    )
    if mode != PLAIN:
        steps = counters.accepted_per_step
        result.drafted = sum(counters.drafted_per_step)
        result.accepted = sum(steps)
        result.accepted_per_step = list(steps)
        result.drafted_per_step = list(counters.drafted_per_step)
        result.lookup_per_step = None if counters.lookup_per_step is None else list(counters.lookup_per_step)
        result.mean_accepted_length = new_tokens / len(steps) if steps else None
    result.time_per_token_ms, result.tokens_per_sec = decode_metrics(
        total_s, prefill_s, new_tokens, new_tokens - result.decode_tokens)
    return result
