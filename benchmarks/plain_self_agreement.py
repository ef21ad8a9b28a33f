"""How far plain greedy decoding disagrees with itself at a precision, on this CPU: the measurement
behind the near-tie epsilon of harness/accuracy/equivalence.py.

For each prompt of the pair's prompt set, plain greedy decoding with the KV cache (one token a
forward pass, as the plain arm runs) writes N tokens; then one forward pass over the prompt and
those tokens, no cache, scores every position again. Per precision it reports how far below that
full forward's top-1 the token decoding chose lies (the largest over every position and prompt: the
epsilon that precision needs on this CPU, since the triage scores a divergence the same way), and
at how many positions decoding chose another token than the full forward's argmax. Assisted
decoding verifies K+1 tokens in one pass, so its rounding is the full forward's, not the decode's.

    python benchmarks/plain_self_agreement.py --pair smollm2-135m+self --precisions fp32,bf16,w8af32
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.accuracy import equivalence as eq  # noqa: E402
from harness.core.jsonio import atomic_write_text  # noqa: E402
from harness.machine import capability  # noqa: E402
from harness.measure.generate import measure_generation  # noqa: E402
from harness.workload import models, prompts, registry  # noqa: E402
from harness.workload.selection import Request, resolve  # noqa: E402

log = logging.getLogger("plain_self_agreement")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="smollm2-135m+self")
    p.add_argument("--precisions", default="fp32,bf16,w8af32", help="target precisions, comma-separated")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens plain decoding writes per prompt")
    p.add_argument("--limit", type=int, default=None, help="the first N prompts of the pair's set")
    p.add_argument("--json", type=Path, default=None, help="write the table here as JSON")
    a = p.parse_args(argv)
    if a.new_tokens < 1:
        p.error(f"--new-tokens {a.new_tokens}: give 1 or more")
    return a


def prompt_row(model, ids, tokens) -> dict:
    """One prompt: the decode's tokens scored by a full forward over prompt + tokens."""
    import torch

    with torch.no_grad():
        full = model(torch.cat([ids, torch.tensor([tokens])], dim=1)).logits[0, ids.shape[1] - 1:-1].float()
    chosen = full.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    below = full.max(dim=1).values - chosen
    return {"positions": len(tokens), "max_below_top1": round(below.max().item(), 4),
            "other_argmax": int((below > 0).sum().item())}


def measure(m, pair: str, precision: str, new_tokens: int, limit: int | None) -> dict:
    sel = resolve(m, Request(pair=pair, target_precision=precision, draft_precision=precision,
                             max_new_tokens=new_tokens, given_by="plain_self_agreement.py"))
    target = models.load(sel.target.spec, precision)
    rows = []
    for p in prompts.load_prompts(sel.prompt_set, target.tokenizer, limit=limit):
        ids = prompts.encode(p, target.tokenizer, chat_template=sel.prompt_set.chat_template)
        tokens = list(measure_generation(target.model, ids, sel.decode).tokens)
        rows.append({"prompt": p.id, **prompt_row(target.model, ids, tokens)})
        log.info("%s %s: %s", precision, p.id, rows[-1])
    return {"precision": precision, "epsilon": eq.EPSILON.get(precision), "prompts": rows,
            "max_below_top1": max(r["max_below_top1"] for r in rows),
            "other_argmax": sum(r["other_argmax"] for r in rows), "positions": sum(r["positions"] for r in rows)}


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    a = parse_args(argv)
    m = registry.load_matrix()
    cls = capability.detect()
    start = time.perf_counter()
    table = [measure(m, a.pair, tp.strip(), a.new_tokens, a.limit) for tp in a.precisions.split(",")]
    print(f"{a.pair}, CPU class {cls.name} ({cls.limited_by}), {a.new_tokens} new tokens a prompt, "
          f"{time.perf_counter() - start:.0f} s")
    print(f"{'precision':<14} {'positions':>9} {'other argmax':>12} {'max below top-1':>16} {'epsilon':>8}")
    for row in table:
        print(f"{row['precision']:<14} {row['positions']:>9} {row['other_argmax']:>12} "
              f"{row['max_below_top1']:>16.4f} {row['epsilon']!s:>8}")
    if a.json:
        atomic_write_text(a.json, json.dumps({"pair": a.pair, "cpu_class": cls.name, "new_tokens": a.new_tokens,
                                              "table": table}, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
