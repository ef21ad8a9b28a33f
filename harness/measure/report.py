"""Tables in the reference's columns, per-configuration summary lines, JSON and markdown files.

JSON results are versioned (`schema_version`), validated against
harness/schemas/bench-results.schema.json on write and on read, and written atomically.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
from pathlib import Path
from typing import Any


from harness import __version__
from harness.core import jsonio
from harness.measure import phases
from harness.measure.bench import BenchConfig, BenchResult
from harness.core.errors import ResultsError
from harness.machine.platform import detect
from harness.machine.provenance import Provenance
from harness.machine.provenance import collect as collect_provenance
from harness.measure.record import COLUMNS, Summary
from harness.workload.registry import PACKAGE_DIR

RESULTS_SCHEMA_VERSION = 6  # 2: speedup_vs_reference per row and summary; 3: provenance (harness/machine/provenance.py); 4: the selection with its origins (harness/workload/selection.py); 5: per-phase costs (harness/measure/phases.py); 6: lookup_per_step (--lookup-first)
RESULTS_SCHEMA = PACKAGE_DIR / "schemas" / "bench-results.schema.json"

def _table(headers: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *(fmt(c) for c in body)])


def describe(result: BenchResult, config_label: str) -> str:
    cfg, sel = result.config, result.config.selection
    t = f"target {sel.target.name} ({sel.target.precision})"
    if config_label == "plain":
        return f"Plain decoding: {t}"
    if cfg.reference and config_label == cfg.reference.label:
        return f"Plain decoding, reference precision: target {sel.target.name} ({cfg.reference.reference})"
    if sel.draft is None:
        return f"Prompt-lookup decoding ({config_label}): {t}"
    return f"Assisted decoding ({config_label}): {t}, draft {sel.draft.name} ({sel.draft.precision})"


def render_tables(result: BenchResult, *, markdown: bool = False) -> str:
    parts = []
    columns = [c for c in COLUMNS if c.key != "speedup_vs_reference" or result.config.reference]
    for s in result.summary:
        rows = [r for r in result.rows if r.configuration == s.configuration]
        body = [[c.cell(r) for c in columns] for r in rows]
        title = describe(result, s.configuration)
        parts.append((f"### {title}\n\n" if markdown else f"{title}\n") + _table([c.header for c in columns], body, markdown))
    return "\n\n".join(parts)


def summary_line(s: Summary) -> str:
    f = lambda v, spec, suffix="": "-" if v is None else f"{v:{spec}}{suffix}"  # noqa: E731
    line = f"{s.configuration:>16}: median {f(s.median_tokens_per_sec, '.2f')} tokens/s"
    if s.mode != "plain":
        line += f", speedup {f(s.median_speedup, '.2f', 'x')}"
        if s.median_speedup_vs_reference is not None:
            line += f" ({f(s.median_speedup_vs_reference, '.2f', 'x')} over the reference plain arm)"
        line += (f", acceptance {f(s.acceptance_rate, '.0%')}, "
                 f"mean accepted length {f(s.mean_accepted_length, '.2f')}")
        if s.prompts_same_tokens_as_plain is not None:
            line += f", same tokens as plain on {s.prompts_same_tokens_as_plain}/{s.prompts} prompts"
    return line


def render_summary(result: BenchResult) -> str:
    lines = ["Summary (medians over prompts):"]
    for s in result.summary:
        line = summary_line(s)
        predicted = result.predicted(s)
        if predicted is not None:
            line += f"; predicted {predicted:.2f}x from the run's step costs (harness/machine/predict.py)"
        lines.append(line)
        lines += [f"{'':>18}{text}" for text in phase_lines(s)]
        if (lookup := lookup_line(result, s)) is not None:
            lines.append(f"{'':>18}{lookup}")
    return "\n".join(lines)


def lookup_line(result: BenchResult, s: Summary) -> str | None:
    """--lookup-first: how many verification steps a prompt lookup proposed, and what they gained."""
    steps = looked_up = gained = 0
    for row in result.rows:
        for sample in row.samples if row.configuration == s.configuration else ():
            flags = sample.get("lookup_per_step")
            steps += len(flags or ())
            for flag, accepted in zip(flags or (), sample.get("accepted_per_step") or ()):
                looked_up += flag
                gained += (accepted + 1) if flag else 0
    if not steps:
        return None
    per_step = f", {gained / looked_up:.2f} new tokens a lookup step" if looked_up else ""
    return f"lookup first: {looked_up} of {steps} steps proposed by the prompt lookup ({looked_up / steps:.0%}){per_step}"


def phase_lines(s: Summary) -> list[str]:
    """Where a configuration's decode time went (harness/measure/phases.py)."""
    return phases.lines(s.phases, s.accounting, s.acceptance_by_position) if s.phases else []


def machine_line(cfg: BenchConfig) -> str:
    """Which CPU class this runs as, what runs, and where each value came from (the selection's)."""
    from harness.machine import capability

    sel = cfg.selection
    lines = [f"CPU class {capability.detect().why}",
             f"selection {sel.pair}: {sel.headline()}"]
    lines += [f"           {reason}" for reason in sel.reasons]
    if cfg.reference:
        lines.append(f"reference  plain decoding at {cfg.reference.reference} runs beside plain "
                     f"{sel.target.precision} ({sel.origin('reference_precision')})")
    if sel.attention.implementation:
        lines.append(f"attention  {sel.attention.implementation} for target and draft (harness/workload/attention.py)")
    if sel.draft_vocab:
        lines.append(f"draft head scores the {sel.draft_vocab} most frequent tokens ({sel.origin('draft_vocab')}; "
                     "harness/workload/drafthead.py)")
    return "\n".join(lines)


def to_json(result: BenchResult, command: list[str] | None = None, origin: Provenance | None = None) -> dict[str, Any]:
    """The results document; `origin`: where it was measured (collected now, without a host probe, if not given)."""
    from harness.machine import capability

    cfg, sel = result.config, result.config.selection
    settings = dataclasses.asdict(sel.decode)
    settings.update({"ks": list(sel.ks), "repeats": cfg.repeats, "assisted_mode": sel.mode,
                     "target_precision": sel.target.precision,
                     "draft_precision": sel.draft.precision if sel.draft else None,
                     "reference_precision": cfg.reference.reference if cfg.reference else sel.target.precision,
                     "draft_vocab": sel.draft_vocab, "attention": sel.attention.implementation,
                     "run_plain": cfg.run_plain, "run_assisted": cfg.run_assisted, "limit": cfg.limit})
    settings["stop_sequences"] = list(settings["stop_sequences"])
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "harness_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command if command is not None else sys.argv),
        "platform": detect(sel.device).as_dict(),
        "provenance": (origin or collect_provenance(sel.device)).as_dict(),
        "pair": sel.pair,
        "task": sel.task,
        "selection": sel.as_dict(),
        "target": result.target,
        "draft": result.draft,
        "reference": result.reference,
        "preset": (None if sel.preset is None else
                   {"name": sel.preset.name, "cpu_class": sel.preset.cpu_class, "why": sel.preset.why}),
        "settings": settings,
        "rows": [dataclasses.asdict(r) for r in result.rows],
        "summary": [dataclasses.asdict(s) for s in result.summary],
        "cpu_class": {**capability.detect().as_dict(), "choice": "; ".join(sel.reasons) or "the pair's own settings"},
        "prediction": {str(k): {**c.as_dict(), "predicted_speedup": next(
            (result.predicted(s) for s in result.summary if s.k == k and s.mode != "plain"), None)}
            for k, c in result.costs.items()},
    }


def validate_results(doc: Any, source: str) -> None:
    jsonio.validate(doc, RESULTS_SCHEMA, source, ResultsError)


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Validated before anything is written; then written atomically."""
    validate_results(doc, f"results for {path}")
    jsonio.atomic_write_text(path, jsonio.dumps(doc, f"results for {path}", ResultsError))


def read_json(path: Path) -> dict[str, Any]:
    doc = jsonio.read_strict(path, ResultsError)
    if isinstance(doc, dict) and isinstance(doc.get("schema_version"), int) and doc["schema_version"] > RESULTS_SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema_version {doc['schema_version']} is newer than this harness "
                           f"reads ({RESULTS_SCHEMA_VERSION}); upgrade the harness")
    if isinstance(doc, dict) and doc.get("schema_version") == 1:
        doc = _migrate_v1(doc)
    if isinstance(doc, dict) and doc.get("schema_version") == 2:
        doc = {**doc, "schema_version": 3, "provenance": None}  # measured before results recorded where from
    if isinstance(doc, dict) and doc.get("schema_version") == 3:
        doc = {**doc, "schema_version": 4, "selection": None}  # before values recorded where they came from
    if isinstance(doc, dict) and doc.get("schema_version") == 4:
        doc = _migrate_v4(doc)
    if isinstance(doc, dict) and doc.get("schema_version") == 5:
        doc = _migrate_v5(doc)
    validate_results(doc, str(path))
    return doc


def _migrate_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no reference plain arm: its rows and summaries get null vs-reference speedups."""
    doc = {**doc, "schema_version": 2}
    doc["rows"] = [{**r, "speedup_vs_reference": None} if isinstance(r, dict) else r for r in doc.get("rows", [])]
    doc["summary"] = [{**s, "median_speedup_vs_reference": None} if isinstance(s, dict) else s
                      for s in doc.get("summary", [])]
    return doc


def _migrate_v4(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 4 had no per-phase costs: samples and summaries get nulls for them."""
    doc = {**doc, "schema_version": 5}
    doc["rows"] = [{**r, "samples": [{**x, "phases": None} if isinstance(x, dict) else x for x in r.get("samples", [])]}
                   if isinstance(r, dict) else r for r in doc.get("rows", [])]
    doc["summary"] = [{**s, "phases": None, "accounting": None, "acceptance_by_position": None}
                      if isinstance(s, dict) else s for s in doc.get("summary", [])]
    return doc


def _migrate_v5(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 5 had no --lookup-first: every step's candidates came from the draft (or the lookup alone)."""
    doc = {**doc, "schema_version": 6}
    doc["rows"] = [{**r, "samples": [{**x, "lookup_per_step": None} if isinstance(x, dict) else x
                                     for x in r.get("samples", [])]}
                   if isinstance(r, dict) else r for r in doc.get("rows", [])]
    return doc


def write_markdown(result: BenchResult, path: Path) -> None:
    cfg, sel = result.config, result.config.selection
    head = (f"# {sel.pair}: task {sel.task}, {sel.decode.max_new_tokens} new tokens, "
            f"{'sampled' if sel.decode.do_sample else 'greedy'}, repeats {cfg.repeats}\n\n"
            f"Platform: `{detect(sel.device).id}`\n\n")
    summary = "\n".join(f"- {summary_line(s).strip()}" for s in result.summary)
    jsonio.atomic_write_text(path, head + render_tables(result, markdown=True) + "\n\n## Summary\n\n" + summary + "\n")
