"""What a fixed length costs the host per scored position: transformers' two min-length logits
processors (what `generate(min_new_tokens=n)` runs on every position a target pass scores) against
the suite's ForcedLength (harness/measure/generate.py), on the default pair's vocabulary, one
intra-op thread as a gate's arm runs. The scores come out equal (checked here once, below the
fixed length; tested in tests/unit/test_generate.py). Figures: docs/bench.md, "A fixed length".

    python benchmarks/forced_length.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinLengthLogitsProcessor,
                                                    MinNewTokensLengthLogitsProcessor)

from harness.measure.generate import ForcedLength

VOCAB = 151_936              # Qwen2.5-Coder's (the default pair's target and draft)
EOS = [151_645, 151_643]     # its generation config's end-of-sequence ids


def per_call_us(processors: LogitsProcessorList, ids: torch.Tensor, scores: torch.Tensor, calls: int,
                repeats: int) -> float:
    """Median over `repeats` of the mean microseconds a call, after a warm-up."""
    for _ in range(calls):
        processors(ids, scores)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            processors(ids, scores)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-len", type=int, default=120)
    p.add_argument("--new-tokens", type=int, default=32, help="the fixed length (the merge gate's rounds: 32)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n, prompt = args.new_tokens, args.prompt_len
    transformers_pair = LogitsProcessorList([MinLengthLogitsProcessor(prompt + n, EOS),
                                             MinNewTokensLengthLogitsProcessor(prompt, n, EOS)])
    ours = LogitsProcessorList([ForcedLength(prompt, n, torch.tensor(EOS))])
    scores = torch.randn(1, VOCAB)
    ids = torch.zeros(1, prompt + n // 2, dtype=torch.long)
    if not torch.equal(transformers_pair(ids, scores), ours(ids, scores)):
        raise SystemExit("forced_length: ForcedLength's scores differ from transformers' processors'")
    print(f"vocabulary {VOCAB:,}, {args.threads} thread(s), torch {torch.__version__}; microseconds a scored position:")
    for name, processors in (("transformers' MinLength + MinNewTokensLength", transformers_pair),
                             ("ForcedLength", ours)):
        us = per_call_us(processors, ids, scores, args.calls, args.repeats)
        print(f"  {name:>44}: {us:8.1f}   (a 17-token verification: {17 * us / 1000:.1f} ms)")


if __name__ == "__main__":
    main()
