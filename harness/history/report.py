"""The run history as one static HTML page (`python -m harness history report`) that a CI can publish
as an artifact: the trend of every series, every change point with its commit range, and the latest
verdicts.

The page needs nothing but itself: the figures (harness/history/plot.py) are PNGs inside it as
base64 data: URIs, the style is inline, there is no script, and every text taken from the history is
HTML-escaped. Rendering logs one progress line per series (harness/core/progress.py).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core import jsonio
from harness.core.progress import bar as progress_bar
from harness.history import changes as chg
from harness.history import plot
from harness.history.series import Detection, Series, short_commit, slug
from harness.history.store import Point

log = logging.getLogger(__name__)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.95em; }
.regression { color: #b22222; font-weight: bold; } .improvement { color: #2e8b57; font-weight: bold; }
.undecided, .inconclusive, .deferred { color: #c07000; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1em; }
dl.meta dt { font-weight: bold; } dl.meta dd { margin: 0; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #555; }
"""


@dataclass(frozen=True)
class Latest:
    """The last run of one combination on one platform, and its verdict per metric."""
    combination: str
    platform_id: str
    point: Point                                    # one of the run's points: its date, commit, kind
    verdicts: tuple[tuple[str, str | None], ...]    # (metric, verdict), by metric


@dataclass(frozen=True)
class Scope:
    """What the page is of: the history file, the filters given, the change-point settings."""
    history: str                                    # Store.name: the file, or a URL without its password
    filters: tuple[tuple[str, str], ...] = ()       # (option, value) of the filters given
    detection: Detection = Detection()


def latest(series: Sequence[Series]) -> list[Latest]:
    """Per combination and platform, its last run (by date) and that run's verdicts."""
    runs: dict[tuple[str, str], list[Point]] = {}
    for s in series:
        runs.setdefault((s.combination, s.platform_id), []).extend(s.points)
    out = []
    for (combination, platform_id), points in runs.items():
        last = max(points, key=lambda p: (p.date, p.run_id))
        verdicts = sorted((p.measurement.metric, p.measurement.verdict) for p in points if p.run_id == last.run_id)
        out.append(Latest(combination, platform_id, last, tuple(verdicts)))
    return out


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], css: str) -> str:
    """A table of escaped headers and cells that are already HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f'<table class="{_e(css)}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def _td(text: object, css: str = "") -> str:
    return f'<td class="{_e(css)}">{_e(text)}</td>' if css else f"<td>{_e(text)}</td>"


def _verdict(verdict: str | None) -> str:
    if verdict is None:
        return "-"
    return f'<span class="{_e(verdict.lower().split()[0] if verdict.strip() else "")}">{_e(verdict.upper())}</span>'


def _header(series: Sequence[Series], scope: Scope, generated: str) -> str:
    points = [p for s in series for p in s.points]
    dates = sorted(p.date for p in points)
    d = scope.detection
    items = [("history", _e(scope.history)),
             ("runs", _e(len({p.run_id for p in points}))),
             ("series", _e(len(series))),
             ("platforms", ", ".join(f"<code>{_e(x)}</code>" for x in sorted({p.platform_id for p in points}))),
             ("dates", f"{_e(dates[0])} to {_e(dates[-1])}" if dates else "-"),
             ("filters", _e(" ".join(f"{k} {v}" for k, v in scope.filters) or "none")),
             ("change points", _e(f"E-Divisive means with {chg.TEST_NAMES[d.test]}: window {d.window}, p-value "
                                  f"below {d.max_pvalue:g}, relative change at least {d.min_magnitude:g}")),
             ("generated", _e(generated))]
    rows = "\n".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<h1>Run history</h1>\n<dl class="meta">\n{rows}\n</dl>'


def _latest_section(series: Sequence[Series]) -> str:
    rows = []
    for r in latest(series):
        verdicts = "<br>".join(f"<code>{_e(metric)}</code> {_verdict(v)}" for metric, v in r.verdicts)
        rows.append([_td(r.combination, "mono"), _td(r.platform_id, "mono"), _td(r.point.date),
                     _td(short_commit(r.point), "mono"), _td(r.point.kind), f"<td>{verdicts}</td>"])
    table = _table(["combination", "platform", "last run", "commit", "kind", "verdict per metric"], rows, "latest")
    return f'<h2 id="latest">Latest verdicts</h2>\n{table}'


def _changes_section(series: Sequence[Series]) -> str:
    rows = []
    for s in series:
        for step in s.steps:
            c = step.change
            link = f'<a href="#{_e(slug(s.key))}">{_e(s.name)}</a>'
            rows.append([f'<td class="mono">{link}</td>', _td(step.direction, step.direction.lower()),
                         _td(f"{c.magnitude:+.1%}", "num"), _td(f"{c.mean_before:.4g} -> {c.mean_after:.4g}", "num"),
                         _td(f"{c.pvalue:.2g}", "num"), _td(step.commit_range, "mono"),
                         _td(f"{step.before.date} .. {step.after.date}")])
    if not rows:
        return '<h2 id="changes">Change points</h2>\n<p>No change point in any series.</p>'
    table = _table(["series", "direction", "magnitude", "means", "p-value", "commit range", "dates"], rows, "changes")
    return f'<h2 id="changes">Change points</h2>\n{table}'


def _figures(series: Sequence[Series]) -> list[str]:
    """Each series' figure as a base64 PNG, one progress line per series."""
    progress = progress_bar(desc="history report", total=len(series), unit="series")
    out = []
    try:
        for s in series:
            out.append(base64.b64encode(plot.png(s)).decode("ascii"))
            progress.set_postfix_str(s.name)
            progress.update()
    finally:
        progress.close()
    return out


def _trend_sections(series: Sequence[Series], images: Sequence[str]) -> str:
    by_combination: dict[str, list[tuple[Series, str]]] = {}
    for s, image in zip(series, images):
        by_combination.setdefault(s.combination, []).append((s, image))
    parts = ['<h2 id="trends">Trends</h2>']
    for combination, items in by_combination.items():
        parts.append(f'<h3 class="mono">{_e(combination)}</h3>')
        for s, image in items:
            caption = f"{s.metric} on {s.platform_id}: {len(s.points)} runs, {len(s.steps)} change point(s)"
            parts.append(f'<figure id="{_e(slug(s.key))}"><img src="data:image/png;base64,{image}" '
                         f'alt="{_e(s.name)}"><figcaption>{_e(caption)}</figcaption></figure>')
    return "\n".join(parts)


def render(series: Sequence[Series], scope: Scope, *, generated: str | None = None) -> str:
    """The page."""
    generated = generated or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    body = "\n".join([_header(series, scope, generated), _latest_section(series), _changes_section(series),
                      _trend_sections(series, _figures(series))])
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>Run history: {_e(scope.history)}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")


def write(path: Path, series: Sequence[Series], scope: Scope) -> Path:
    """Render the page and write it whole or not at all."""
    jsonio.atomic_write_text(Path(path), render(series, scope))
    log.debug("%s: %d series, %d change point(s)", path, len(series), sum(len(s.steps) for s in series))
    return Path(path)
