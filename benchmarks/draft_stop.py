"""When should the draft stop drafting, and can it score fewer tokens? (issue 30, items 2 and 3)

Under greedy decoding the text is the target's greedy text whatever the draft proposes, so every
assisted step starts at a known position of it. This measures once, for each position of the
target's greedy text on the prompts, what the draft (in its fused loop) proposes from there: up to
--kmax tokens, each with its probability under the draft, and how many of them the target accepts.
From that table any stopping rule can be replayed exactly, step by step, without rerunning:

  constant K          K tokens a step (today)
  confidence c        stop after a drafted token whose probability is below c (transformers'
                      `assistant_confidence_threshold`; without scikit-learn it stays fixed)
  cumulative c        stop once the product of the drafted tokens' probabilities, the draft's own
                      estimate that all of them are accepted, is below c

and for a draft whose output layer scores only its S most frequent tokens (harness/workload/
drafthead.py) the replay takes the subset's token where it differs from the full layer's (a drafted
token the full layer would have got right is then lost), optionally falling back to the full layer
where the subset's top token has a probability below F within the subset.

The cost of a step comes from times measured here, with the threads a bench run uses: the target's
verification of n+1 tokens for each n, a draft pass, and the draft's output layer alone (full and
over S rows), so each rule's predicted time per token is (sum of its steps' verification and draft
passes) / tokens. Each rule's tokens per step and drafted tokens per step are exact; its time per
token is a prediction to be confirmed by bench.

    python benchmarks/draft_stop.py --preset fastest --out benchmarks/data/draft_stop_avx512-bf16.json

Run it with nothing else on the machine: the costs are wall times.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from harness.core import jsonio
from harness.workload import models, prompts
from harness.workload.drafthead import ranked_tokens
from harness.workload.fused_draft import fused
from harness.workload.registry import load_matrix
from harness.workload.selection import Request, resolve

log = logging.getLogger("draft_stop")


# ---- the table ----------------------------------------------------------------------------------

@torch.no_grad()
def target_text(model: Any, input_ids: torch.Tensor, new_tokens: int, eos: set[int]) -> list[int]:
    """The target's greedy continuation (up to `new_tokens`, ending at an end-of-sequence token)."""
    out = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    text = out[0, input_ids.shape[1]:].tolist()
    for i, token in enumerate(text):
        if token in eos:
            return text[:i + 1]
    return text


@torch.no_grad()
def draft_rows(draft: Any, input_ids: torch.Tensor, text: list[int], kmax: int,
               subsets: dict[int, torch.Tensor]) -> list[dict[str, Any]]:
    """For each position i of `text`: the draft's greedy proposal from prompt + text[:i] (full output
    layer), each token's probability, for each subset size the subset's top token and its probability
    within the subset at each drafted position, and `m`, how many proposed tokens equal text[i:]."""
    loop = fused(draft)
    loop.length = 0
    context = input_ids[0].tolist()
    loop(torch.tensor([context[:-1]]))  # the cache holds everything before the last context token
    rows = []
    for i in range(len(text)):
        last = (context + text)[len(context) + i - 1]
        base = len(context) + i - 1
        loop.length = base  # the prefix: what the previous position drafted after it is written over
        logits = loop(torch.tensor([[last]]))
        tokens, probs, sub = [], [], {s: ([], []) for s in subsets}
        for j in range(kmax):
            p = logits.softmax(-1)[0]
            token = int(p.argmax())
            tokens.append(token)
            probs.append(float(p[token]))
            for s, keep in subsets.items():
                q = logits[0, keep].softmax(-1)
                top = int(q.argmax())
                sub[s][0].append(int(keep[top]))
                sub[s][1].append(float(q[top]))
            if j + 1 < kmax:
                logits = loop(torch.tensor([[token]]))
        truth = text[i:]
        m = next((j for j, t in enumerate(tokens) if j >= len(truth) or t != truth[j]), len(tokens))
        # room: the most a step here may draft (transformers leaves room for the target's own token)
        rows.append({"m": m, "room": len(truth) - 1, "tokens": tokens, "p": probs,
                     "subset": {str(s): {"tokens": v[0], "p": v[1]} for s, v in sub.items()}})
    return rows


# ---- the costs ----------------------------------------------------------------------------------

def _median_ms(fn: Callable[[], Any], n: int, warmup: int = 2) -> float:
    times = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def verification_ms(target: Any, input_ids: torch.Tensor, kmax: int, repeats: int) -> dict[int, float]:
    """Median ms of the target's pass over n+1 new tokens with a warm cache, n = 0..kmax."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    target(input_ids=input_ids, past_key_values=cache, use_cache=True)
    length = input_ids.shape[1]
    out = {}
    for n in range(kmax + 1):
        block = input_ids[:, -(n + 1):]

        def verify() -> None:
            target(input_ids=block, past_key_values=cache, use_cache=True,
                   cache_position=torch.arange(length, length + n + 1))
            cache.crop(-(n + 1))  # this transformers crops by a negative count

        out[n] = _median_ms(verify, repeats)
    return out


@torch.no_grad()
def draft_pass_ms(draft: Any, input_ids: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median ms of one fused-loop pass and of its output layer alone. A layer over S of the vocab's
    rows is costed at S / vocab of the full one (`subset_ms`): timed alone, a small layer stays in
    the last-level cache and looks cheaper than inside a pass, which evicts it with the other
    layers' weights."""
    loop = fused(draft)
    loop.length = 0
    loop(input_ids)
    base = loop.length
    token = torch.tensor([[int(input_ids[0, -1])]])

    def step() -> None:
        loop.length = base
        loop(token)

    hidden = loop.norm(torch.randn(1, 1, loop.embed.weight.shape[1], dtype=loop.dtype))
    return {"pass": _median_ms(step, repeats), "head": _median_ms(lambda: loop.head(hidden), repeats * 4)}


# ---- the replay ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """How many tokens a step drafts, from the probabilities of those drafted so far."""

    kind: str      # constant | confidence | cumulative
    k: int         # the most a step drafts
    value: float = 0.0

    @property
    def name(self) -> str:
        return f"K={self.k}" if self.kind == "constant" else f"{self.kind} {self.value:g}, K<={self.k}"

    def drafted(self, probs: list[float]) -> int:
        product = 1.0
        for j, p in enumerate(probs[:self.k]):
            product *= p
            if self.kind == "confidence" and p < self.value:
                return j + 1
            if self.kind == "cumulative" and product < self.value:
                return j + 1
        return min(self.k, len(probs))


@dataclass(frozen=True)
class Head:
    """Which output layer drafts: the full one (size 0) or S rows, with a fallback below `fallback`."""

    size: int = 0
    fallback: float = 0.0

    @property
    def name(self) -> str:
        if not self.size:
            return "full"
        return f"{self.size} rows" + (f", full below {self.fallback:g}" if self.fallback else "")


def subset_ms(cost: dict[str, Any], size: int) -> float:
    """A layer over `size` of the vocabulary's rows: its share of the full output layer's time."""
    return cost["draft"]["head"] * size / cost["draft"]["vocab"]


def replay(rows: list[dict[str, Any]], rule: Rule, head: Head, cost: dict[str, Any]) -> dict[str, float]:
    """Step through one prompt's text under `rule` and `head`; counts and predicted milliseconds."""
    steps = drafted = fallbacks = tokens = 0
    ms = 0.0
    pass_ms = cost["draft"]["pass"] - (cost["draft"]["head"] - subset_ms(cost, head.size) if head.size else 0)
    i = 0
    while i < len(rows):
        row = rows[i]
        probs, accepted_upto = list(row["p"]), row["m"]
        passes_full = 0
        if head.size:
            sub = row["subset"][str(head.size)]
            for j, (t, q) in enumerate(zip(sub["tokens"], sub["p"])):
                if head.fallback and q < head.fallback:
                    passes_full += 1     # this pass scored every token as well: the full layer's token
                    continue
                probs[j] = q             # the subset drafts: its token and its probability
                if t != row["tokens"][j]:
                    # the target accepts no token after this one; the rule drafts on (its later
                    # probabilities are the full layer's: the subset's own path is not in the table)
                    accepted_upto = min(accepted_upto, j)
                    break
        n = min(rule.drafted(probs), row["room"])
        a = min(n, accepted_upto)
        fb = min(passes_full, n)
        steps += 1
        drafted += n
        fallbacks += fb
        tokens += a + 1
        ms += cost["verify"][n] + n * pass_ms + fb * cost["draft"]["head"]
        i += a + 1
    return {"steps": steps, "drafted": drafted, "tokens": tokens, "fallbacks": fallbacks, "ms": ms}


def evaluate(table: list[list[dict[str, Any]]], rule: Rule, head: Head, cost: dict[str, Any]) -> dict[str, Any]:
    per = [replay(rows, rule, head, cost) for rows in table]
    total = {k: sum(p[k] for p in per) for k in per[0]}
    return {"rule": rule.name, "head": head.name, "tokens_per_step": total["tokens"] / total["steps"],
            "drafted_per_step": total["drafted"] / total["steps"],
            "wasted_per_step": (total["drafted"] - total["tokens"] + total["steps"]) / total["steps"],
            "fallback_share": total["fallbacks"] / max(total["drafted"], 1),
            "ms_per_token": total["ms"] / total["tokens"],
            "ms_per_token_median_prompt": statistics.median(p["ms"] / p["tokens"] for p in per)}


def rules(kmax: int) -> list[Rule]:
    out = [Rule("constant", k) for k in range(2, kmax + 1)]
    for k in sorted({8, kmax}):
        out += [Rule("confidence", k, c) for c in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)]
        out += [Rule("cumulative", k, c) for c in (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)]
    return out


def heads(sizes: list[int]) -> list[Head]:
    return [Head()] + [Head(s, f) for s in sizes for f in (0.0, 0.3, 0.5, 0.7, 0.9)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="fastest",
                    help="registry preset whose models and precisions run (default fastest; 'none': the CPU class's choice)")
    ap.add_argument("--pair", default=None, help="registry pair (default: the registry's default pair)")
    ap.add_argument("--kmax", type=int, default=12, help="the most tokens a step drafts in the table (default 12)")
    ap.add_argument("--limit", type=int, default=8, help="prompts of the pair's set (default 8, as bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the target's greedy text per prompt (default 64)")
    ap.add_argument("--subsets", default="16384,32768,65536",
                    help="output-layer sizes to replay (frequency-ranked rows, drafthead.py); '' for none")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per cost (default 15)")
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="a cheaper draft: the draft cut to its first N decoder layers (its norm and output "
                         "layer kept): how often it still agrees with the target (item 5's first check)")
    ap.add_argument("--table", type=Path, default=None, help="replay a table a previous run wrote (--out)")
    ap.add_argument("--out", type=Path, default=None, help="write the table, costs and replays as JSON")
    args = ap.parse_args(argv)
    if args.kmax < 2:
        ap.error(f"--kmax {args.kmax}: give 2 or more")
    args.sizes = [int(s) for s in args.subsets.split(",") if s.strip()]
    return args


def cut_layers(model: Any, n: int) -> None:
    """Keep the draft's first n decoder layers (--draft-layers)."""
    layers = model.model.layers
    if not 1 <= n <= len(layers):
        raise SystemExit(f"--draft-layers {n}: the draft has {len(layers)} layers")
    model.model.layers = layers[:n]
    model.config.num_hidden_layers = n
    print(f"draft cut to its first {n} of {len(layers)} layers")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The table (every prompt's positions) and the costs, from the models."""
    preset = None if args.preset == "none" else args.preset
    sel = resolve(load_matrix(), Request(pair=args.pair, preset=preset, fused_draft=True))
    if sel.draft is None:
        raise SystemExit(f"pair {sel.pair}: it has no draft model (prompt lookup)")
    print(f"target {sel.target.name} ({sel.target.precision}), draft {sel.draft.name} ({sel.draft.precision}), "
          f"{torch.get_num_threads()} threads, CPU class {sel.cpu_class}")
    target = models.load(sel.target.spec, sel.target.precision)
    draft = models.load(sel.draft.spec, sel.draft.precision)
    if args.draft_layers:
        cut_layers(draft.model, args.draft_layers)
    tok = target.tokenizer
    vocab = getattr(draft.model.get_output_embeddings(), "out_features", draft.model.config.vocab_size)
    ranked = ranked_tokens(draft.tokenizer, vocab)
    subsets = {s: torch.sort(ranked[:s]).values for s in args.sizes}
    eos_ids = target.model.generation_config.eos_token_id
    eos = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
    chosen = prompts.load_prompts(sel.prompt_set, tok, limit=args.limit)
    table = []
    for n, prompt in enumerate(chosen, 1):
        ids = prompts.encode(prompt, tok)
        t0 = time.perf_counter()
        text = target_text(target.model, ids, args.max_new_tokens, eos)
        table.append(draft_rows(draft.model, ids, text, args.kmax, subsets))
        print(f"[{n}/{len(chosen)}] {prompt.id}: {len(text)} tokens, {time.perf_counter() - t0:.0f} s")
    ids = prompts.encode(chosen[0], tok)
    print("timing the target's verification and the draft's passes ...")
    cost = {"verify": verification_ms(target.model, ids, args.kmax, args.repeats),
            "draft": {**draft_pass_ms(draft.model, ids, args.repeats), "vocab": vocab}}
    return {"cpu_class": sel.cpu_class, "threads": torch.get_num_threads(), "target": sel.target.name,
            "target_precision": sel.target.precision, "draft": sel.draft.name, "draft_precision": sel.draft.precision,
            "draft_layers": args.draft_layers, "kmax": args.kmax, "prompts": [p.id for p in chosen],
            "max_new_tokens": args.max_new_tokens, "cost": cost, "table": table}


def print_replays(data: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """Every rule under every output layer, the best of each printed; all of them returned."""
    table, cost = data["table"], data["cost"]
    print(f"costs (ms): draft pass {cost['draft']['pass']:.1f}, its output layer {cost['draft']['head']:.1f}"
          + "".join(f", {s} rows {subset_ms(cost, s):.1f}" for s in sizes)
          + "; verification " + ", ".join(f"{n + 1}:{v:.0f}" for n, v in cost["verify"].items()))
    results = [evaluate(table, r, h, cost) for r, h in itertools.product(rules(data["kmax"]), heads(sizes))]
    best = min(results, key=lambda r: r["ms_per_token"])
    full = [r for r in results if r["head"] == "full"]
    constant = min((r for r in full if r["rule"].startswith("K=")), key=lambda r: r["ms_per_token"])
    print(f"{'rule':<28} {'head':<28} {'tok/step':>8} {'drafted':>8} {'wasted':>7} {'fallb.':>6} {'ms/token':>9}")
    shown = sorted(full, key=lambda r: r["ms_per_token"])[:12] + sorted(
        (r for r in results if r["head"] != "full"), key=lambda r: r["ms_per_token"])[:12]
    for r in [constant] + shown:
        print(f"{r['rule']:<28} {r['head']:<28} {r['tokens_per_step']:8.2f} {r['drafted_per_step']:8.2f} "
              f"{r['wasted_per_step']:7.2f} {r['fallback_share']:6.1%} {r['ms_per_token']:9.1f}")
    print(f"best: {best['rule']}, {best['head']}: {best['ms_per_token']:.1f} ms a token predicted, against "
          f"{constant['ms_per_token']:.1f} for the best constant K ({constant['rule']})")
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = args.sizes
    if args.table:
        data = json.loads(args.table.read_text())
        data["cost"]["verify"] = {int(n): v for n, v in data["cost"]["verify"].items()}
        sizes = [s for s in sizes if str(s) in data["table"][0][0]["subset"]]
    else:
        data = measure(args)
    results = print_replays(data, sizes)
    if args.out:
        data["replays"] = results
        jsonio.atomic_write_text(args.out, json.dumps(data) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
