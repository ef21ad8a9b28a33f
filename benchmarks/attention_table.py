"""Attention implementations against each other on one loaded pair: prefill ms, plain and assisted
tokens/s, the speedup and the greedy-equivalence verdict per implementation (harness/workload/attention.py).

The target and the draft are loaded once; before each run both are switched to the arm's
implementation (transformers' set_attn_implementation, which swaps the attention function only),
so every arm runs the same weights, and the arms alternate per prompt in ABBA order.

    python benchmarks/attention_table.py                                   # eager vs sdpa, ~8 min
    python benchmarks/attention_table.py --implementations eager sdpa flex_attention --prompts 2
    python benchmarks/attention_table.py --task benchmark --prompts 5      # prompts of 32-512 tokens
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from harness.accuracy import equivalence as eq
from harness.measure import generate, interleave
from harness.workload import attention, models, prompts, registry, selection


def measure(target, draft, plist, inputs, settings, k, implementations, precision) -> list[dict]:
    arms = [(impl, mode) for impl in implementations for mode in (generate.PLAIN, generate.ASSISTED)]
    runs: dict[tuple[str, str], list[generate.GenerationResult]] = {arm: [] for arm in arms}

    def run(arm, ids, s):
        impl, mode = arm
        for m in (target.model, draft.model):
            m.set_attn_implementation(impl)
        return generate.measure_generation(target.model, ids, s, mode=mode, k=k if mode == generate.ASSISTED else None,
                                           assistant=draft.model if mode == generate.ASSISTED else None)

    for impl in implementations:  # a compiled implementation (flex_attention) compiles here, not in a timed run
        interleave.warm_up([(impl, m) for m in (generate.PLAIN, generate.ASSISTED)], run, inputs, settings)
    for i, ids in enumerate(inputs):
        for arm in interleave.abba(arms, i):
            runs[arm].append(run(arm, ids, settings))
        print(f"  prompt {plist[i].id} ({ids.shape[1]} tokens): "
              + ", ".join(f"{a[0]} {a[1]} {r[-1].tokens_per_sec:.1f}" for a, r in runs.items()),
              file=sys.stderr, flush=True)
    rows = []
    for impl in implementations:
        plain, assisted = runs[(impl, generate.PLAIN)], runs[(impl, generate.ASSISTED)]
        target.model.set_attn_implementation(impl)
        verdicts = [eq.triage(target.model, p.id, ids, pr.tokens, ar.tokens, eq.EPSILON[precision])
                    for p, ids, pr, ar in zip(plist, inputs, plain, assisted)]
        rows.append({
            "attention": impl,
            "prefill_ms": statistics.median(r.prefill_ms for r in plain),
            "plain_time_per_token_ms": statistics.median(r.time_per_token_ms for r in plain),
            "plain_tokens_per_sec": statistics.median(r.tokens_per_sec for r in plain),
            "assisted_tokens_per_sec": statistics.median(r.tokens_per_sec for r in assisted),
            "speedup": statistics.median(p.time_per_token_ms / a.time_per_token_ms for p, a in zip(plain, assisted)),
            "equivalence": eq.counts(verdicts),
        })
    return rows


def print_table(rows: list[dict]) -> None:
    print("| attention | prefill ms | plain ms/token | plain tok/s | assisted tok/s | speedup | equivalence |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["equivalence"]
        print(f"| {r['attention']} | {r['prefill_ms']:.1f} | {r['plain_time_per_token_ms']:.1f} | "
              f"{r['plain_tokens_per_sec']:.2f} | {r['assisted_tokens_per_sec']:.2f} | {r['speedup']:.2f}x | "
              f"{c['exact']} exact, {c['near-tie']} near-tie, {c['failed']} failed |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--implementations", nargs="+", default=["eager", "sdpa"], choices=attention.ON_CPU)
    ap.add_argument("--target-precision", default=None, choices=registry.precisions(),
                    help="default: the pair's choice for this CPU class")
    ap.add_argument("--draft-precision", default=None, choices=registry.precisions())
    ap.add_argument("--task", default="decode", choices=("decode", "benchmark", "benchmark_code"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    matrix = registry.load_matrix()
    sel = selection.resolve(matrix, selection.Request(
        pair=args.pair, target_precision=args.target_precision, draft_precision=args.draft_precision, task=args.task,
        max_new_tokens=args.max_new_tokens))
    tp, dp, settings = sel.target.precision, sel.draft.precision, sel.decode
    start = time.perf_counter()
    target, draft = models.load(sel.target.spec, tp), models.load(sel.draft.spec, dp)
    ps = sel.prompt_set
    plist = prompts.load_prompts(ps, target.tokenizer, limit=args.prompts)
    inputs = [prompts.encode(p, target.tokenizer, chat_template=ps.chat_template) for p in plist]
    rows = measure(target, draft, plist, inputs, settings, sel.k, args.implementations, tp)
    print_table(rows)
    print(f"\n({time.perf_counter() - start:.0f} s; pair {sel.pair} {sel.precisions}, K={sel.k}, "
          f"task {args.task}: {len(inputs)} prompts of {min(x.shape[1] for x in inputs)}-"
          f"{max(x.shape[1] for x in inputs)} tokens x {args.max_new_tokens} new tokens, greedy)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pair": sel.pair, "precisions": sel.precisions, "task": args.task,
                                         "prompts": [p.id for p in plist], "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
