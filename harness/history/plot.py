"""The trend of one history series as a PNG (`python -m harness history plot`, and the images of
`history report`).

x is the run's place in the series (oldest first), labelled with its commit (its date where it has
none); y the run's median with its interval as error bars where the run has one. A gate verdict
REGRESSION is a red triangle. Each step of the series (harness/history/series.py) is a dashed line
between the last run before it and the first after it, the means on either side as horizontal
segments, and a label with its size, p-value and the commit range to bisect.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.core import jsonio
from harness.history.series import Series, Step, slug
from harness.history.store import Point

log = logging.getLogger(__name__)

BLUE, RED, GREEN, GREY = "#2a7ab9", "#b22222", "#2e8b57", "#8c8c8c"
MAX_TICKS = 16
DPI = 110


def annotation(step: Step) -> str:
    """The label a step gets in the figure."""
    c = step.change
    return (f"{step.direction} {c.magnitude:+.1%} (p {c.pvalue:.1g})\n"
            f"{c.mean_before:.4g} -> {c.mean_after:.4g}\n{step.commit_range}")


def annotations(s: Series) -> list[str]:
    """The labels of the series' steps, oldest first: what `figure` writes beside each."""
    return [annotation(step) for step in s.steps]


def _literal(text: str) -> str:
    """Text matplotlib draws as written: a '$' would start its math mode."""
    return text.replace("$", r"\$")


def tick_label(p: Point) -> str:
    if p.commit:
        return p.commit[:8] + ("+" if p.dirty else "")
    return p.date[:10]


def _ticks(points: Sequence[Point], s: Series) -> list[int]:
    """About MAX_TICKS evenly spaced runs, and the two runs around each step (whose labels the
    evenly spaced ones beside them would overprint)."""
    every = max(1, math.ceil(len(points) / MAX_TICKS))
    around = {i for step in s.steps for i in (step.change.index - 1, step.change.index)}
    spaced = {i for i in range(0, len(points), every) if every == 1 or all(abs(i - j) > every // 2 for j in around)}
    return sorted(spaced | around)


def _draw_points(ax: Any, s: Series) -> None:
    points = s.points
    medians = [p.measurement.median for p in points]
    ax.plot(range(len(points)), medians, "-o", color=BLUE, lw=1, ms=3.5, label="median of the run")
    spans = [(i, p.measurement) for i, p in enumerate(points)
             if p.measurement.low is not None and p.measurement.high is not None]
    if spans:
        ax.errorbar([i for i, _ in spans], [m.median for _, m in spans],
                    yerr=[[max(m.median - m.low, 0.0) for _, m in spans], [max(m.high - m.median, 0.0) for _, m in spans]],
                    fmt="none", ecolor=BLUE, alpha=0.45, capsize=2, lw=1, label="interval")
    flagged = [(i, p.measurement.median) for i, p in enumerate(points)
               if (p.measurement.verdict or "").lower() == "regression"]
    if flagged:
        ax.scatter([i for i, _ in flagged], [v for _, v in flagged], marker="v", s=70, color=RED, zorder=5,
                   label="gate verdict REGRESSION")


def _draw_steps(ax: Any, s: Series) -> None:
    edges = [0, *(step.change.index for step in s.steps), len(s.points)]
    for k, step in enumerate(s.steps):
        at, c = step.change.index - 0.5, step.change
        color = RED if step.regression else GREEN
        ax.axvline(at, color=color, ls="--", lw=1, label="change point; the mean on either side" if k == 0 else None)
        ax.hlines(c.mean_before, edges[k] - 0.3, at, color=color, lw=2, alpha=0.8)
        ax.hlines(c.mean_after, at, edges[k + 2] - 0.7, color=color, lw=2, alpha=0.8)
        right_half = at > len(s.points) / 2
        ax.annotate(annotation(step), xy=(at, 0.97 - 0.2 * (k % 2)), xycoords=ax.get_xaxis_transform(),
                    xytext=(-4 if right_half else 4, 0), textcoords="offset points", va="top",
                    ha="right" if right_half else "left", fontsize=7.5, color=color,
                    bbox=dict(boxstyle="round,pad=0.25", fc="white", ec=color, alpha=0.85))


def figure(s: Series) -> Any:
    """The series' figure (a matplotlib Figure on the Agg canvas; no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_points(ax, s)
    if s.steps:
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.45 * (hi - lo))  # room for the labels above the data
        _draw_steps(ax, s)
    ticks = _ticks(s.points, s)
    ax.set_xticks(ticks)
    ax.set_xticklabels([_literal(tick_label(s.points[i])) for i in ticks], rotation=35, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(s.points) - 0.4)
    ax.set_xlabel("run, oldest first (commit)")
    ax.set_ylabel(_literal(s.metric))
    ax.set_title(_literal(f"{s.combination}\n{s.metric} on {s.platform_id}: {len(s.points)} runs, "
                          f"{len(s.steps)} change point(s)"), fontsize=9)
    ax.grid(alpha=0.25)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False)
    fig.tight_layout()
    return fig


def png(s: Series) -> bytes:
    """The series' figure as PNG bytes."""
    buffer = io.BytesIO()
    figure(s).savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def write(s: Series, directory: Path) -> Path:
    """<directory>/<slug>.png, written whole or not at all."""
    path = Path(directory) / f"{slug(s.key)}.png"
    jsonio.atomic_write_bytes(path, png(s))
    log.debug("%s: %s", s.name, path)
    return path


def write_all(series: Sequence[Series], directory: Path) -> Iterator[Path]:
    """One PNG per series, yielding each path as it is written."""
    for s in series:
        yield write(s, directory)
