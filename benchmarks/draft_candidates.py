"""Would a cheaper draft model pay? (issue 30, item 5's first check)

For each candidate draft, transformers' assisted generation runs greedy on the pair's prompts with a
constant K, beside plain decoding of the target, the arms interleaved per prompt. A candidate with
another tokenizer than the target's runs through transformers' assisted generation across
tokenizers (`tokenizer=` / `assistant_tokenizer=`: the draft's tokens are decoded to text and
encoded again with the target's tokenizer at every step). Per candidate it reports:

  tokens a step    new tokens / the target's forward passes: 1 + the drafted tokens kept a step
  draft pass       median ms of the candidate's one-token forward passes
  verification     median ms of the target's passes over the K+1 tokens
  ms a token       the measured time per token, and plain decoding's beside it (the speedup)
  equal            whether the assisted text equals plain greedy decoding's on every prompt

so the check is the candidate's agreement with the target and what a step costs with it, before any
work to integrate it (a fused loop, a class choice).

    python benchmarks/draft_candidates.py                       # the pair's draft and SmolLM2-135M
    python benchmarks/draft_candidates.py --candidates smollm2-135m-instruct:bf16 -k 4 --limit 2

Run it with nothing else on the machine: the times are wall times.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from harness.core import jsonio
from harness.measure.phases import PassTimer
from harness.workload import models, prompts
from harness.workload.registry import load_matrix
from harness.workload.selection import Request, resolve

log = logging.getLogger("draft_candidates")

DEFAULT_CANDIDATES = "qwen2.5-coder-0.5b-instruct:w8af32-tensor,smollm2-135m-instruct:w8af32-tensor"


@dataclass(frozen=True)
class Arm:
    """One generate call on one prompt."""

    name: str
    prompt: str
    new_tokens: int
    seconds: float
    target_passes: int
    target_ms: tuple[float, ...]  # every target pass after the first
    draft_ms: tuple[float, ...]  # every one-token draft pass
    text: tuple[int, ...]


def assisting(target: Any, draft: Any, k: int) -> dict[str, Any]:
    """The generate arguments that make `draft` assist `target` at a constant K, decided once per
    candidate: across tokenizers where their vocabularies differ."""
    draft.model.generation_config.num_assistant_tokens = k
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0
    kwargs: dict[str, Any] = {"assistant_model": draft.model}
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        kwargs.update(tokenizer=target.tokenizer, assistant_tokenizer=draft.tokenizer)
    return kwargs


def run_arm(name: str, target: Any, assist: dict[str, Any] | None, ids: torch.Tensor, prompt: str,
            args: argparse.Namespace) -> Arm:
    """One greedy generation, plain (assist None) or assisted (`assisting`), every forward pass timed."""
    timer = PassTimer(time.perf_counter)
    handles = timer.attach(target.model, "target")
    settings: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "do_sample": False,
                                "pad_token_id": target.tokenizer.pad_token_id or 0}
    if assist is not None:
        handles += timer.attach(assist["assistant_model"], "draft")
        settings.update(assist)
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        seconds = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    text = tuple(out[0, ids.shape[1]:].tolist())
    target_calls = [c for c in timer.calls if c.model == "target"]
    return Arm(name, prompt, len(text), seconds, timer.target_passes,
               tuple(c.seconds * 1e3 for c in target_calls[1:]),
               tuple(c.seconds * 1e3 for c in timer.calls if c.model == "draft" and c.tokens == 1), text)


def summary(name: str, arms: list[Arm], plain: list[Arm]) -> dict[str, Any]:
    """A candidate's figures over the prompts, against plain decoding on the same prompts."""
    tokens = sum(a.new_tokens for a in arms)
    ms_token = [a.seconds * 1e3 / a.new_tokens for a in arms]
    plain_ms = [p.seconds * 1e3 / p.new_tokens for p in plain]
    draft = [m for a in arms for m in a.draft_ms]
    verify = [m for a in arms for m in a.target_ms]
    return {"candidate": name, "prompts": len(arms), "new_tokens": tokens,
            "tokens_per_step": tokens / max(1, sum(a.target_passes for a in arms)),
            "draft_pass_ms": statistics.median(draft) if draft else None,
            "verify_ms": statistics.median(verify) if verify else None,
            "ms_per_token": sum(a.seconds for a in arms) * 1e3 / tokens,
            "plain_ms_per_token": sum(p.seconds for p in plain) * 1e3 / sum(p.new_tokens for p in plain),
            "median_speedup": statistics.median(p / m for p, m in zip(plain_ms, ms_token)),
            "equal_prompts": sum(a.text == p.text for a, p in zip(arms, plain))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None, help="registry pair whose target and prompts run (default: the default pair)")
    ap.add_argument("--target-precision", default="bf16", help="the target's precision (default bf16)")
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES,
                    help=f"MODEL:PRECISION,... registry models to draft with (default {DEFAULT_CANDIDATES})")
    ap.add_argument("-k", type=int, default=8, help="tokens drafted a step, constant (default 8)")
    ap.add_argument("--limit", type=int, default=8, help="prompts of the pair's set (default 8, as bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--out", type=Path, default=None, help="write every arm and the summaries as JSON")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"-k {args.k}: give 1 or more")
    args.candidate_list = []
    for item in filter(None, (s.strip() for s in args.candidates.split(","))):
        name, _, precision = item.partition(":")
        args.candidate_list.append((name, precision or "bf16"))
    if not args.candidate_list:
        ap.error("--candidates: name at least one MODEL[:PRECISION]")
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    matrix = load_matrix()
    sel = resolve(matrix, Request(pair=args.pair))
    target = models.load(sel.target.spec, args.target_precision)
    drafts = {f"{n}:{p}": assisting(target, models.load(models.resolve_spec(matrix, n), p), args.k)
              for n, p in args.candidate_list}
    chosen = prompts.load_prompts(sel.prompt_set, target.tokenizer, limit=args.limit)
    print(f"target {sel.target.name} ({args.target_precision}), K={args.k}, {len(chosen)} prompts x "
          f"{args.max_new_tokens} tokens, {torch.get_num_threads()} threads, CPU class {sel.cpu_class}")
    names = ["plain", *drafts]
    arms: dict[str, list[Arm]] = {n: [] for n in names}
    warm = prompts.encode(chosen[0], target.tokenizer)[:, :32]
    for n in names:
        run_arm(n, target, drafts.get(n), warm, "warm-up", argparse.Namespace(**{**vars(args), "max_new_tokens": 8}))
    for i, prompt in enumerate(chosen):
        ids = prompts.encode(prompt, target.tokenizer)
        for n in (names if i % 2 == 0 else names[::-1]):
            arms[n].append(run_arm(n, target, drafts.get(n), ids, prompt.id, args))
        print(f"[{i + 1}/{len(chosen)}] {prompt.id}: " + ", ".join(
            f"{n} {a[-1].new_tokens / a[-1].seconds:.1f} tok/s" for n, a in arms.items()), flush=True)
    return {"cpu_class": sel.cpu_class, "threads": torch.get_num_threads(), "target": sel.target.name,
            "target_precision": args.target_precision, "k": args.k, "max_new_tokens": args.max_new_tokens,
            "summaries": [summary(n, arms[n], arms["plain"]) for n in drafts],
            "arms": {n: [asdict(a) for a in a_list] for n, a_list in arms.items()}}


def print_table(data: dict[str, Any]) -> None:
    print(f"{'candidate':<42} {'tok/step':>8} {'draft ms':>8} {'verify ms':>9} {'ms/token':>8} "
          f"{'plain':>6} {'speedup':>7} {'equal':>6}")
    for s in data["summaries"]:
        draft = "-" if s["draft_pass_ms"] is None else f"{s['draft_pass_ms']:.1f}"
        print(f"{s['candidate']:<42} {s['tokens_per_step']:8.2f} {draft:>8} {s['verify_ms']:9.1f} "
              f"{s['ms_per_token']:8.1f} {s['plain_ms_per_token']:6.1f} {s['median_speedup']:6.2f}x "
              f"{s['equal_prompts']:>3}/{s['prompts']}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = measure(args)
    print_table(data)
    if args.out:
        jsonio.atomic_write_text(args.out, json.dumps(data) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
