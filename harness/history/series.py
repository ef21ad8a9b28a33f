"""The history's series (one combination and metric on one platform, oldest first) and the steps in
each: the change points of harness/history/changes.py with the runs on either side of them.

The one place that groups the store's points into series and turns a change point into the commit
range it lies in; `history changes`, `history plot` and `history report` all read them from here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from harness.history import changes as chg
from harness.history.store import Point

SeriesKey = tuple[str, str, str]  # (combination, metric, platform id)


def slug(key: SeriesKey) -> str:
    """A file name for a series (its figure, its Otava CSV): its names with anything but letters,
    digits, '.', '_' and '-' as '_', cut to a length every file system takes, and a hash of the full
    names so two series never share one."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", "__".join(key)).strip("._-")
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:8]
    return f"{text[:150] or 'series'}-{digest}"


def short_commit(p: Point) -> str:
    """A run's commit as the history prints it: 12 hex digits, '+dirty' when its tree had changes."""
    return (p.commit or "-")[:12] + ("+dirty" if p.dirty else "")


def group(points: Iterable[Point]) -> dict[SeriesKey, list[Point]]:
    """The points per (combination, metric, platform), each list in the order given (oldest first)."""
    series: dict[SeriesKey, list[Point]] = {}
    for p in points:
        series.setdefault((p.measurement.combination, p.measurement.metric, p.platform_id), []).append(p)
    return series


@dataclass(frozen=True)
class Step:
    """A change point with the last run before it and the first run after it."""
    change: chg.ChangePoint
    before: Point
    after: Point
    regression: bool       # worse for this metric (changes.is_regression)

    @property
    def direction(self) -> str:
        return "REGRESSION" if self.regression else "improvement"

    @property
    def commit_range(self) -> str:
        """The commits to bisect between: 'before..after'."""
        return f"{short_commit(self.before)}..{short_commit(self.after)}"


@dataclass(frozen=True)
class Series:
    combination: str
    metric: str
    platform_id: str
    points: tuple[Point, ...]
    steps: tuple[Step, ...]

    @property
    def key(self) -> SeriesKey:
        return (self.combination, self.metric, self.platform_id)

    @property
    def name(self) -> str:
        return f"{self.combination}  {self.metric}  on {self.platform_id}"


@dataclass(frozen=True)
class Detection:
    """The change-point settings (`history changes --window --max-pvalue --min-magnitude --test`)."""
    window: int = chg.WINDOW
    max_pvalue: float = chg.MAX_PVALUE
    min_magnitude: float = chg.MIN_MAGNITUDE
    test: str = chg.TEST


def analysed(key: SeriesKey, points: list[Point], detection: Detection = Detection()) -> Series:
    """One series with its steps, oldest first."""
    combination, metric, platform_id = key
    found = chg.change_points([p.measurement.median for p in points], window=detection.window,
                              max_pvalue=detection.max_pvalue, min_magnitude=detection.min_magnitude,
                              test=detection.test)
    steps = tuple(Step(c, points[c.index - 1], points[c.index], chg.is_regression(metric, c)) for c in found)
    return Series(combination, metric, platform_id, tuple(points), steps)


def analyse(series: dict[SeriesKey, list[Point]], detection: Detection = Detection()) -> list[Series]:
    """Every series with its steps, in the order given."""
    return [analysed(key, points, detection) for key, points in series.items()]
