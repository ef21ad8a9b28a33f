"""What each precision buys on this machine: the issue-4 tables.

Table 1, per model of a pair (target and draft) and per precision: time to quantize (from the
quantization record, also when the checkpoint came from the cache), plain greedy decode tokens/s
(median over prompts), perplexity on held-out text (quant/corpus.toml) and its ratio to bf16.

Table 2, assisted: per target+draft precision combination, plain and assisted tokens/s of the
same prompts (interleaved per prompt), the speedup over the same target precision's plain
decoding, tokens/s over plain bf16 decoding (table 1's figure, same run), and whether the
assisted tokens equal the plain ones on every prompt.

    python benchmarks/quant_table.py --json results/quant_table.json       # about an hour, cold cache
    python benchmarks/quant_table.py --pair smollm2-135m+self --precisions bf16 w8af32 w8af32-tensor \\
        --combinations bf16+w8af32 --prompts 2                              # minutes
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from harness.measure import generate, interleave
from harness.workload import models, prompts, registry, selection
from quant.calibration import token_windows
from quant.perplexity import perplexity

ALL = ["bf16", "w8af32", "w8af32-tensor", "w8abf16", "w8a8", "w6a16", "w4abf16", "w4abf16-rtn"]
COMBINATIONS = ["bf16+bf16", "bf16+w8af32", "w4abf16+bf16", "w4abf16+w8af32", "w4abf16+w4abf16",
                "w8af32+w8af32", "w8af32-tensor+w8af32-tensor"]


def encoded_prompts(sel, tokenizer, n):
    ps = sel.prompt_set
    return [prompts.encode(p, tokenizer, chat_template=ps.chat_template)
            for p in prompts.load_prompts(ps, tokenizer, limit=n)]


def decode_rate(model, inputs, settings):
    generate.measure_generation(model, inputs[0], interleave.warmup_settings(settings))
    return statistics.median(generate.measure_generation(model, x, settings).tokens_per_sec for x in inputs)


def precision_rows(sel, role, precisions, inputs_for, settings, windows_for):
    spec = getattr(sel, role).spec
    rows = []
    for prec in precisions:
        print(f"[{role}] {spec.name} {prec}: loading / quantizing", file=sys.stderr, flush=True)
        try:
            loaded = models.load(spec, prec)
        except Exception as exc:  # an unsupported shape, say: a row that says so
            rows.append({"role": role, "model": spec.name, "precision": prec, "error": str(exc)})
            continue
        inputs = inputs_for(loaded.tokenizer)
        rate = decode_rate(loaded.model, inputs, settings)
        ppl = perplexity(loaded.model, windows_for(loaded.tokenizer))
        rec = loaded.quant_record or {}
        rows.append({"role": role, "model": spec.name, "precision": prec, "decode_tokens_per_sec": rate,
                     "perplexity": ppl, "quantize_s": rec.get("seconds"), "cached": rec.get("cached"),
                     "load_s": loaded.load_s, "settings": rec.get("settings")})
        print(f"  {rate:.2f} tok/s, perplexity {ppl:.3f}", file=sys.stderr, flush=True)
        del loaded
        gc.collect()
    bf16 = next((r["perplexity"] for r in rows if r["precision"] == "bf16" and "error" not in r), None)
    for r in rows:
        if bf16 and "perplexity" in r:
            r["perplexity_vs_bf16"] = r["perplexity"] / bf16
    return rows


def assisted_rows(sel, combinations, n_prompts, settings, plain_bf16):
    rows = []
    by_target: dict[str, list[str]] = {}
    for c in combinations:
        t, d = c.split("+")
        by_target.setdefault(t, []).append(d)
    for tprec, dprecs in by_target.items():
        target = models.load(sel.target.spec, tprec)
        inputs = encoded_prompts(sel, target.tokenizer, n_prompts)
        for dprec in dprecs:
            print(f"[assisted] target {tprec} + draft {dprec}", file=sys.stderr, flush=True)
            draft = models.load(sel.draft.spec, dprec)
            kw = {"mode": generate.ASSISTED, "k": sel.k, "assistant": draft.model}
            generate.measure_generation(target.model, inputs[0], interleave.warmup_settings(settings), **kw)
            plain, assisted = [], []
            for x in inputs:  # interleaved: one plain, one assisted per prompt
                plain.append(generate.measure_generation(target.model, x, settings))
                assisted.append(generate.measure_generation(target.model, x, settings, **kw))
            p_ms = statistics.median(r.time_per_token_ms for r in plain)
            a_ms = statistics.median(r.time_per_token_ms for r in assisted)
            acc = sum(r.accepted for r in assisted) / max(1, sum(r.drafted for r in assisted))
            same = all(p.tokens == a.tokens for p, a in zip(plain, assisted))
            rows.append({"combination": f"{tprec}+{dprec}", "plain_tokens_per_sec": 1000 / p_ms,
                         "assisted_tokens_per_sec": 1000 / a_ms, "speedup": p_ms / a_ms,
                         "over_plain_bf16": (1000 / a_ms) / plain_bf16 if plain_bf16 else None,
                         "acceptance": acc, "same_tokens": same,
                         "prompts_equal": sum(p.tokens == a.tokens for p, a in zip(plain, assisted))})
            print(f"  plain {1000 / p_ms:.2f}, assisted {1000 / a_ms:.2f} tok/s, speedup {p_ms / a_ms:.2f}x, "
                  f"same tokens {same}", file=sys.stderr, flush=True)
            del draft
            gc.collect()
        del target
        gc.collect()
    return rows


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def print_tables(prec_rows, asst_rows):
    print("| model | precision | quantize s | decode tok/s | perplexity | vs bf16 |")
    print("|---|---|---|---|---|---|")
    for r in prec_rows:
        if "error" in r:
            print(f"| {r['model']} | {r['precision']} | error: {r['error'][:80]} | | | |")
            continue
        print(f"| {r['model']} | {r['precision']} | {fmt(r['quantize_s'], '.1f')} | {fmt(r['decode_tokens_per_sec'])}"
              f" | {fmt(r['perplexity'], '.3f')} | {fmt(r.get('perplexity_vs_bf16'), '.3f')} |")
    if asst_rows:
        print()
        print("| target+draft | plain tok/s | assisted tok/s | speedup | over plain bf16 | acceptance | same tokens |")
        print("|---|---|---|---|---|---|---|")
        for r in asst_rows:
            print(f"| {r['combination']} | {fmt(r['plain_tokens_per_sec'])} | {fmt(r['assisted_tokens_per_sec'])} | "
                  f"{fmt(r['speedup'])}x | {fmt(r['over_plain_bf16'])}x | {r['acceptance']:.0%} | "
                  f"{'yes' if r['same_tokens'] else 'no'} ({r['prompts_equal']}) |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None, help="a pair of harness/matrix.toml (default: the registry's default)")
    ap.add_argument("--precisions", nargs="+", default=ALL, choices=registry.precisions())
    ap.add_argument("--roles", nargs="+", default=["target", "draft"], choices=["target", "draft"])
    ap.add_argument("--combinations", nargs="*", default=COMBINATIONS, help="target+draft precisions (none: skip)")
    ap.add_argument("--prompts", type=int, default=3, help="decode prompts of the pair's set")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ppl-windows", type=int, default=None, help="held-out windows (default: quant/corpus.toml)")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    matrix = registry.load_matrix()
    sel = selection.resolve(matrix, selection.Request(pair=args.pair, max_new_tokens=args.max_new_tokens,
                                                      fixed_length=True, check_here=False))
    for c in args.combinations:
        parts = c.split("+")
        if len(parts) != 2 or any(p not in registry.precisions() for p in parts):
            ap.error(f"--combinations: {c!r}: write TARGET+DRAFT precisions, from {', '.join(registry.precisions())}")
    settings = sel.decode
    start = time.perf_counter()
    rows = []
    for role in args.roles:
        if getattr(sel, role) is None:
            continue
        rows += precision_rows(sel, role, args.precisions, lambda tok: encoded_prompts(sel, tok, args.prompts), settings,
                               lambda tok: token_windows(tok, "heldout", windows=args.ppl_windows))
    plain_bf16 = next((r["decode_tokens_per_sec"] for r in rows
                       if r["role"] == "target" and r["precision"] == "bf16" and "error" not in r), None)
    asst = assisted_rows(sel, args.combinations, args.prompts, settings, plain_bf16) if args.combinations else []
    print_tables(rows, asst)
    print(f"\n({time.perf_counter() - start:.0f} s; pair {sel.pair}, {args.prompts} prompts x {args.max_new_tokens} "
          f"new tokens, greedy, K={sel.k})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pair": sel.pair, "precisions": rows, "assisted": asst}, indent=2))


if __name__ == "__main__":
    main()
