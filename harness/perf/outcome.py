"""The one verdict vocabulary of both perf gates, for a metric and for a combination.

A metric's decision is one of PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE (more rounds are
coming) or UNDECIDED (still inconclusive at the cap). A combination's outcome combines its
metrics (`combine`), and adds the two outcomes that are not decisions: DEFERRED (the stored
gate found this host not comparable with the baseline's) and STAGED (a baseline measured by
--perf-update-baselines, not judged). The stored-baseline gate and the A/B gate say the same words
for the same thing: a REGRESSION is a slowdown beyond half the tolerance, significant at the
gate's false-alarm rate, in either gate.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Outcome(str, enum.Enum):
    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"
    UNDECIDED = "undecided"
    DEFERRED = "deferred"
    STAGED = "baseline staged"

    def __str__(self) -> str:
        return self.value

    @property
    def gated(self) -> bool:
        """Whether the combination was judged (DEFERRED and STAGED were not)."""
        return self not in (Outcome.DEFERRED, Outcome.STAGED)

    @property
    def word(self) -> str:
        """How the terminal and the reports write it: decisions in capitals, 'pass' too."""
        return self.value.upper()


def combine(metrics: Iterable[Outcome], *, behaviour_changed: bool = False) -> Outcome:
    """A combination's outcome from its metrics' decisions: a regression anywhere (or greedy
    counters that differ: a behaviour change, never noise) wins, then an undecided metric, then an
    improvement; otherwise PASS."""
    seen = set(metrics)
    if behaviour_changed or Outcome.REGRESSION in seen:
        return Outcome.REGRESSION
    if seen & {Outcome.UNDECIDED, Outcome.INCONCLUSIVE}:
        return Outcome.UNDECIDED
    return Outcome.IMPROVEMENT if Outcome.IMPROVEMENT in seen else Outcome.PASS


def settled(metrics: Iterable[Outcome]) -> bool:
    """Whether a gate may stop looking: a metric regressed (the outcome cannot become a pass), or
    none is inconclusive."""
    seen = set(metrics)
    return Outcome.REGRESSION in seen or Outcome.INCONCLUSIVE not in seen
