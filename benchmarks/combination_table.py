"""Every target x draft precision combination of a pair, against plain decoding at the target's own
precision AND against plain bf16, interleaved per prompt, with acceptance and the greedy-equivalence
verdict (harness/accuracy/equivalence.py): the table issue 15 asks for.

Per target precision, three arms run on every prompt in ABBA order: plain bf16 (the reference, one
bf16 copy of the target kept loaded), plain at the target's precision, and assisted with each draft.
Speedups are medians over prompts of per-prompt time-per-token ratios (the same definition as
`python -m harness bench`).

    python benchmarks/combination_table.py --json results/combination_table.json          # ~40 min
    python benchmarks/combination_table.py --targets w8af32 --drafts w8af32-tensor --prompts 2
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

from harness.accuracy import equivalence as eq
from harness.measure import generate, interleave
from harness.workload import models, prompts, registry, selection

TARGETS = ["bf16", "w8af32", "w8abf16", "w6a16", "w4abf16", "w4abf16-rtn"]
DRAFTS = ["bf16", "w8af32-tensor", "w8af32", "w4abf16-rtn"]


def fmt(v, spec=".2f", suffix=""):
    return "-" if v is None else f"{v:{spec}}{suffix}"


def ratio(base: list[generate.GenerationResult], runs: list[generate.GenerationResult]) -> float:
    return statistics.median(b.time_per_token_ms / r.time_per_token_ms for b, r in zip(base, runs))


def measure_target(sel, t, reference, drafts, plist, inputs, settings, k, draft_vocab) -> list[dict]:
    """One target precision: plain bf16, plain at `t` and assisted with each draft, interleaved per prompt."""
    print(f"loading target {t}", file=sys.stderr, flush=True)
    target = reference if t == "bf16" else models.load(sel.target.spec, t)
    arms = [("bf16", reference.model, None)] + ([(t, target.model, None)] if t != "bf16" else [])
    arms += [(f"{t}+{d}", target.model, drafts[d].model) for d in drafts]
    runs: dict[str, list[generate.GenerationResult]] = {name: [] for name, _, _ in arms}

    def run(arm, ids, s):
        name, model, draft = arm
        mode = generate.ASSISTED if draft is not None else generate.PLAIN
        return generate.measure_generation(model, ids, s, mode=mode, k=k if draft is not None else None,
                                           assistant=draft)

    interleave.warm_up(arms, run, inputs, settings)
    for i, ids in enumerate(inputs):
        for arm in interleave.abba(arms, i):
            runs[arm[0]].append(run(arm, ids, settings))
        print(f"  {t} prompt {plist[i].id}: " + ", ".join(f"{n} {r[-1].tokens_per_sec:.1f}" for n, r in runs.items()),
              file=sys.stderr, flush=True)
    rows = []
    for d in drafts:
        a = runs[f"{t}+{d}"]
        verdicts = [eq.triage(target.model, p.id, ids, pr.tokens, ar.tokens, eq.EPSILON[t])
                    for p, ids, pr, ar in zip(plist, inputs, runs[t], a)]
        c = eq.counts(verdicts)
        rows.append({
            "target": t, "draft": d, "k": k, "draft_vocab": draft_vocab,
            "plain_tokens_per_sec": statistics.median(r.tokens_per_sec for r in runs[t]),
            "assisted_tokens_per_sec": statistics.median(r.tokens_per_sec for r in a),
            "plain_bf16_tokens_per_sec": statistics.median(r.tokens_per_sec for r in runs["bf16"]),
            "speedup": ratio(runs[t], a), "over_plain_bf16": ratio(runs["bf16"], a),
            "acceptance": sum(r.accepted for r in a) / max(1, sum(r.drafted for r in a)),
            "mean_accepted_length": sum(r.new_tokens for r in a) / max(1, sum(r.target_forwards for r in a)),
            "equivalence": c, "verdict": "FAILED" if c["failed"] else ("exact" if c["exact"] == len(a) else "near-ties"),
        })
    return rows


def print_table(rows: list[dict]) -> None:
    print("| target | draft | plain tok/s | assisted tok/s | speedup vs same-precision plain | vs plain bf16 "
          "| acceptance | tokens/step | equivalence |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["equivalence"]
        print(f"| {r['target']} | {r['draft']} | {fmt(r['plain_tokens_per_sec'])} | {fmt(r['assisted_tokens_per_sec'])} | "
              f"{fmt(r['speedup'], '.2f', 'x')} | {fmt(r['over_plain_bf16'], '.2f', 'x')} | {r['acceptance']:.0%} | "
              f"{r['mean_accepted_length']:.2f} | {r['verdict']} ({c['exact']} exact, {c['near-tie']} near-tie) |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--targets", nargs="+", default=TARGETS, choices=registry.precisions())
    ap.add_argument("--drafts", nargs="+", default=DRAFTS, choices=registry.precisions())
    ap.add_argument("-k", type=int, default=None, help="draft tokens per step (default: the pair's)")
    ap.add_argument("--draft-vocab", type=int, default=None, help="restrict the draft's output layer (drafthead.py)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    matrix = registry.load_matrix()
    sel = selection.resolve(matrix, selection.Request(pair=args.pair, ks=(args.k,) if args.k else None,
                                                      max_new_tokens=args.max_new_tokens, check_here=False))
    k, settings = sel.k, sel.decode
    start = time.perf_counter()
    reference = models.load(sel.target.spec, "bf16")
    ps = sel.prompt_set
    plist = prompts.load_prompts(ps, reference.tokenizer, limit=args.prompts)
    inputs = [prompts.encode(p, reference.tokenizer, chat_template=ps.chat_template) for p in plist]
    drafts = {d: models.load(sel.draft.spec, d, draft_vocab=args.draft_vocab) for d in args.drafts}
    rows = []
    for t in args.targets:
        rows += measure_target(sel, t, reference, drafts, plist, inputs, settings, k, args.draft_vocab)
        gc.collect()
    print_table(rows)
    print(f"\n({time.perf_counter() - start:.0f} s; pair {sel.pair}, {len(inputs)} prompts x {args.max_new_tokens} "
          f"new tokens, greedy, K={k}{f', draft vocabulary {args.draft_vocab}' if args.draft_vocab else ''})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pair": sel.pair, "k": k, "prompts": [p.id for p in plist],
                                         "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
