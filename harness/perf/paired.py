"""The A/B gate's statistics: paired per-round log ratios of candidate to base.

Both arms run each round within the same minute, so noise that moves the whole machine (another
tenant, a frequency step) hits both and cancels in d = ln(candidate / base). The gate tests the
mean of d with a t interval, sequentially: after `rounds`, then every `batch` rounds up to `cap`,
stopping as soon as every metric is decided.

With tolerance T, the decision threshold is a change of T/2 either way (a slowdown of T must be
called a regression, no change must pass):
  REGRESSION   the whole interval is below ln(1 - T/2)
  IMPROVEMENT  the whole interval is above ln(1 + T/2)
  PASS         the whole interval is above ln(1 - T/2) (no regression of T/2 or more)
  inconclusive otherwise: more rounds; UNDECIDED at the cap.

False alarms: `family_alpha` is the chance that a gate run (every metric of every combination,
over all looks) calls a regression or an improvement that is not there. It is split by
Bonferroni over metrics x combinations x looks and the two directions, which is conservative.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE, UNDECIDED = "pass", "regression", "improvement", "inconclusive", "undecided"
DEFAULT_FAMILY_ALPHA = 0.01


def looks(rounds: int, batch: int, cap: int) -> int:
    """How many times the gate may look at the data: after `rounds`, then every `batch` up to `cap`."""
    return 1 + max(0, -(-(cap - rounds) // batch))


def alpha_per_test(family_alpha: float, tests: int, n_looks: int) -> float:
    """One side of one metric at one look (Bonferroni over tests, looks and the two directions)."""
    return family_alpha / (2 * max(1, tests) * max(1, n_looks))


@dataclass
class PairedDecision:
    metric: str
    verdict: str
    change: float      # geometric-mean candidate / base - 1
    ci_low: float      # interval of candidate / base
    ci_high: float
    rounds: int
    tolerance: float
    alpha: float       # per side, per look

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        what = {REGRESSION: "REGRESSION", IMPROVEMENT: "IMPROVEMENT", PASS: "pass", UNDECIDED: "UNDECIDED",
                INCONCLUSIVE: "inconclusive"}[self.verdict]
        line = (f"{self.metric}: {what}, candidate/base {self.change * 100:+.1f}% "
                f"({100 * (1 - 2 * self.alpha):.2f}% CI [{(self.ci_low - 1) * 100:+.1f}%, {(self.ci_high - 1) * 100:+.1f}%], "
                f"{self.rounds} paired rounds, threshold -{self.tolerance / 2:.1%})")
        if self.verdict == UNDECIDED:
            line += (f" -- at the cap the interval still spans -{self.tolerance / 2:.1%}: too noisy to tell a "
                     f"{self.tolerance:.0%} change from none (raise --perf-max-repeats or use a quieter machine)")
        return line


def decide(metric: str, ratios: Sequence[float], *, tolerance: float, alpha: float, at_cap: bool) -> PairedDecision:
    """The verdict on one metric from its per-round candidate/base ratios."""
    d = [math.log(r) for r in ratios]
    n = len(d)
    mean = statistics.fmean(d)
    if n < 2:
        return PairedDecision(metric, UNDECIDED if at_cap else INCONCLUSIVE, math.exp(mean) - 1, 0.0, math.inf, n,
                              tolerance, alpha)
    from scipy.stats import t

    half = float(t.ppf(1 - alpha, n - 1)) * statistics.stdev(d) / math.sqrt(n)
    low, high = mean - half, mean + half
    down, up = math.log(1 - tolerance / 2), math.log(1 + tolerance / 2)
    if high < down:
        verdict = REGRESSION
    elif low > up:
        verdict = IMPROVEMENT
    elif low > down:
        verdict = PASS
    else:
        verdict = UNDECIDED if at_cap else INCONCLUSIVE
    return PairedDecision(metric, verdict, math.exp(mean) - 1, math.exp(low), math.exp(high), n, tolerance, alpha)
