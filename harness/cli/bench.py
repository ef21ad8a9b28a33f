"""`python -m harness bench`: plain and assisted decoding interleaved per prompt, the reference's table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.options import float_in, int_in, parse_ks
from harness.workload import registry
from harness.core.errors import BadInputError
from harness.history.store import location as history_location
from harness.workload.selection import Request


def _what_runs(b: argparse.ArgumentParser) -> None:
    """The pair, or models given by name or path (harness/workload/selection.py resolves them)."""
    which = b.add_mutually_exclusive_group()
    which.add_argument("--pair", help="registry pair (default: the registry's defaults.pair); see `python -m harness pairs`")
    which.add_argument("--model-name", dest="model_name", metavar="NAME",
                       help="the reference example's spelling: one of its model names (CodeLlama-7b-hf, "
                            "llama-2-7b, ...) or a registry model; picks the pair whose target it is")
    b.add_argument("--target", metavar="NAME_OR_PATH",
                   help="the target model: a registry model, a Hugging Face model folder or a hub id, in place "
                        "of the pair's (without --pair: precisions, K and prompts from the registry's defaults)")
    b.add_argument("--draft", metavar="NAME_OR_PATH",
                   help="the draft model, likewise (a --target without --draft runs plain against prompt lookup)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="measure plain and assisted decoding (the reference's table)")
    _what_runs(b)
    b.add_argument("--task", choices=("decode", "benchmark", "benchmark_code"),
                   help="decode: the pair's prompt set; benchmark: fixed prompt lengths, exactly "
                        "--max-new-tokens new tokens; benchmark_code: HumanEval prompts")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--compare", dest="mode", action="store_const", const="compare",
                      help="plain and assisted interleaved per prompt, with the speedup (default)")
    mode.add_argument("--assisted-generation", dest="mode", action="store_const", const="assisted",
                      help="assisted decoding only")
    mode.add_argument("--plain", dest="mode", action="store_const", const="plain", help="plain decoding only")
    precisions = registry.precisions()
    b.add_argument("--target-precision", choices=precisions)
    b.add_argument("--draft-precision", choices=precisions)
    b.add_argument("--reference-precision", choices=precisions, metavar="P",
                   help="also run plain decoding of the target at precision P (e.g. bf16 beside an int8 "
                        "target's own plain arm): the 'vs Reference' column; default: no second plain arm")
    b.add_argument("--draft-vocab", type=int_in(1, 10_000_000), metavar="N",
                   help="the draft's output layer scores only its N most frequent tokens (a cheaper draft "
                        "step; the output is unchanged, acceptance may fall): harness/workload/drafthead.py")
    b.add_argument("--preset", metavar="NAME",
                   help="the pair's settings measured best for this CPU class, e.g. 'fastest' (precisions, K, "
                        "reference precision; options given explicitly still win); see `python -m harness pairs`")
    b.add_argument("--attention", metavar="NAME",
                   help="attention implementation of target and draft: eager, sdpa (transformers' default) or "
                        "flex_attention on a CPU; harness/workload/attention.py")
    b.add_argument("--fast-attention", action="store_true", default=None,
                   help="the reference's fused attention kernel: flash_attention_2 on a GPU with flash-attn, "
                        "sdpa on a CPU (says so)")
    b.add_argument("--do-sample", action="store_true", default=None, help="sample instead of greedy decoding")
    b.add_argument("--temperature", type=float_in(0.0, 100.0, lo_open=True))
    b.add_argument("--top-p", type=float_in(0.0, 1.0, lo_open=True))
    b.add_argument("--seed", type=int_in(0, 2**31 - 1))
    b.add_argument("--num-assistant-tokens", "-k", dest="ks", type=parse_ks, metavar="K",
                   help="draft tokens per step: 6, a list 2,4,6 or a sweep 2-8 (plain runs shared)")
    b.add_argument("--schedule", choices=registry.schedules(),
                   help="K schedule (default constant: heuristic changes K during and across runs)")
    b.add_argument("--confidence-threshold", type=float_in(0.0, 1.0),
                   help="transformers' assistant confidence threshold (default 0: off)")
    b.add_argument("--prompt-lookup", type=int_in(1, 64), metavar="N",
                   help="prompt-lookup decoding with N candidate tokens instead of the draft model")
    b.add_argument("--lookup-first", type=int, metavar="N",
                   help="before each draft step, a prompt lookup: where the context ends with N or more tokens "
                        "seen before in it, what followed them is the step's candidates and the draft does not "
                        "run (harness/workload/lookup_first.py; default: off)")
    b.add_argument("--fused-draft", action=argparse.BooleanOptionalAction, default=None,
                   help="run the draft in a fused decode loop of its own (fused q/k/v and gate/up layers, a static "
                        "KV cache, no generate per drafted token): greedy, a constant K, Llama/Qwen2 drafts "
                        "(harness/workload/fused_draft.py); default: as the preset or the CPU class's choice says")
    b.add_argument("--max-new-tokens", type=int_in(2, 8192))
    b.add_argument("--repeats", type=int_in(1, 1000), help="runs per prompt and configuration (medians reported)")
    b.add_argument("--limit", type=int_in(1, 100000), help="only the first N prompts")
    b.add_argument("--platform", help="registry platform (cpu, cuda, ...); default cpu")
    b.add_argument("--json", type=Path, metavar="PATH", help="write results JSON (validated, atomic)")
    b.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")
    b.add_argument("--history", type=history_location, metavar="PATH_OR_URL",
                   help="append this run's medians to the run history: an SQLite file (created if missing) or a "
                        "postgresql:// URL (default: $HARNESS_HISTORY if set)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")


# The reference example's spellings (assisted_generation.py), read as the suite's own options.
REFERENCE_SPELLINGS = {"--model_name": "--model-name", "--assisted_generation": "--assisted-generation",
                       "--draft_precision": "--draft-precision", "--target_precision": "--target-precision",
                       "--do_sample": "--do-sample", "--top_p": "--top-p", "--max_new_tokens": "--max-new-tokens",
                       "--num_assistant_tokens": "--num-assistant-tokens", "--fast_attention": "--fast-attention"}


def reference_spellings(argv: list[str]) -> list[str]:
    """`bench`'s arguments with the reference's underscore spellings (also `--opt=value`) replaced."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        out.append(REFERENCE_SPELLINGS.get(name, name) + eq + value if name.startswith("--") else arg)
    return out


def run(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    from harness.machine import hostspeed, provenance
    from harness.measure import bench, report
    from harness.history import bench as history_bench
    from harness.history import store as history_store

    if (args.temperature is not None or args.top_p is not None) and not args.do_sample:
        raise BadInputError("--temperature and --top-p apply to sampling; add --do-sample")
    pair = matrix.pair_for_model_name(args.model_name).name if args.model_name else args.pair
    request = Request(
        pair=pair, target=args.target, draft=args.draft, preset=args.preset, task=args.task,
        target_precision=args.target_precision, draft_precision=args.draft_precision,
        reference_precision=args.reference_precision, draft_vocab=args.draft_vocab, ks=args.ks,
        prompt_lookup=args.prompt_lookup, lookup_first=args.lookup_first,
        fused_draft=args.fused_draft, attention=args.attention, fast_attention=bool(args.fast_attention),
        do_sample=bool(args.do_sample), temperature=args.temperature, top_p=args.top_p, seed=args.seed or 0,
        schedule=args.schedule, confidence_threshold=args.confidence_threshold,
        max_new_tokens=args.max_new_tokens, platform=args.platform)
    cfg = bench.build_config(matrix, request, mode=args.mode or "compare", repeats=args.repeats, limit=args.limit)
    print(report.machine_line(cfg), flush=True)
    if cfg.selection.attention.note:
        print(cfg.selection.attention.note, flush=True)
    # where the results come from, the host probe measured before any model loads (about a second)
    history = args.history or history_store.default_path()
    device = cfg.selection.device
    origin = provenance.collect(device, host_probe=hostspeed.measure() if device == "cpu" else None) \
        if args.json or history else None
    result = bench.run_bench(cfg, progress=not args.no_progress)
    print()
    print(report.render_tables(result))
    print()
    print(report.render_summary(result))
    if args.json:
        report.write_json(report.to_json(result, ["python", "-m", "harness", *sys.argv[1:]], origin), args.json)
        print(f"results: {args.json}")
    if args.markdown:
        report.write_markdown(result, args.markdown)
        print(f"markdown: {args.markdown}")
    if history and origin:
        run = history_bench.run(result, origin)
        with history_store.open_store(history) as store:
            run_id, new = store.append(run)
            name = store.name
        print(f"history: run {run_id} {'appended to' if new else 'already in'} {name} "
              f"({len(run.measurements)} measurements)")
    return 0

