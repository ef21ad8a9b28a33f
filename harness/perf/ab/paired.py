"""The A/B gate's statistics: paired per-round log ratios of candidate to base.

Both arms run each round within the same minute, so noise that moves the whole machine (another
tenant, a frequency step) hits both and cancels in d = ln(candidate / base). The gate looks at the
mean of d after `rounds`, then every `batch` rounds up to `cap`, and stops once a metric regressed
or every metric is decided (harness/perf/outcome.py `settled`), and no phase is still a suspect
(harness/perf/ab/gate.py `_settled`).

With tolerance T (the slowdown the gate exists to catch), each call carries its own stated error
rate:
  REGRESSION   significantly slower (the alpha-interval lies below 0), by an estimated T/2 or more
  IMPROVEMENT  significantly faster (the alpha-interval lies above 0), by an estimated T/2 or more
  PASS         a slowdown of T/2 or more is ruled out: the one-sided beta-bound lies above -T/2
  inconclusive otherwise: more rounds; UNDECIDED at the cap.
A slowdown of T/2 or more passes at most at the miss rate; one of exactly T/2 is called a
regression in about half the gates (when its estimate falls beyond T/2) and ends UNDECIDED otherwise.

Why the estimate must pass T/2 and significance alone is not enough: rounds within one pair of
worker processes share that pair's offset (memory placement, which core each landed on), which
the per-round spread does not show. Measured on the default pair, 8-round blocks of unchanged
code differed by up to +2.6% with a within-block spread of 1%: significant, but not a change of
the code. Restarting the workers (`ABSettings.restart_every`) spreads such offsets over the gate;
the T/2 floor keeps a single pair's offset from being called a regression.

Error rates (`Design`):
- false alarm: `family_alpha` is the chance that a gate run (every metric of every combination,
  over all looks) calls a regression or an improvement that is not there. Bonferroni over
  metrics x combinations x looks x the two directions: conservative, valid whatever the correlation.
- miss: `miss_rate` is the chance that one metric slowed by T/2 or more is called PASS, split over
  the looks. A missed slowdown and a false alarm are different mistakes, so a PASS does not have to
  clear the false-alarm bar: an unchanged commit passes in a few rounds, while a regression call
  still needs the strict one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.perf.errorrates import split, t_quantile
from harness.perf.outcome import Outcome

DEFAULT_FAMILY_ALPHA = 0.01
DEFAULT_MISS_RATE = 0.05


def looks(rounds: int, batch: int, cap: int) -> int:
    """How many times the gate may look at the data: after `rounds`, then every `batch` up to `cap`."""
    return 1 + max(0, -(-(cap - rounds) // batch))


@dataclass(frozen=True)
class Design:
    """The sequential test's thresholds and error rates for one gate run."""
    tolerance: float
    tests: int          # metrics x combinations gated in the run (the false-alarm family)
    looks: int
    family_alpha: float = DEFAULT_FAMILY_ALPHA
    miss_rate: float = DEFAULT_MISS_RATE

    @property
    def alpha(self) -> float:
        """One direction of one metric at one look, for a REGRESSION or IMPROVEMENT call."""
        return split(self.family_alpha, 2, self.tests, self.looks)

    @property
    def beta(self) -> float:
        """One metric at one look, for a PASS call."""
        return split(self.miss_rate, self.looks)


def shown(change: float, ci_low: float, ci_high: float, cost: bool) -> tuple[float, float, float]:
    """(change, interval low, interval high) in percent as a reader expects them: for tokens/s
    candidate / base - 1; for a phase's cost also candidate / base - 1, so a slower phase is positive."""
    if not cost:
        return change * 100, (ci_low - 1) * 100, (ci_high - 1) * 100
    inverse = lambda r: (1 / r - 1) * 100 if r > 0 else math.inf  # noqa: E731
    return inverse(1 + change), inverse(ci_high), inverse(ci_low)


@dataclass
class PairedDecision:
    metric: str
    verdict: Outcome
    change: float      # geometric-mean candidate / base - 1
    ci_low: float      # alpha-interval of candidate / base (two-sided, 1 - 2 alpha)
    ci_high: float
    pass_bound: float  # one-sided beta lower bound of candidate / base: PASS when above 1 - T/2
    rounds: int
    tolerance: float
    alpha: float       # per side, per look
    beta: float        # per look
    cost: bool = False  # a phase's cost (ratios are base / candidate): shown as the candidate's time change

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def se(self) -> float:
        """The standard error of the mean log ratio: the PASS bound lies t(1 - beta) of them below the mean."""
        if self.rounds < 2 or self.pass_bound <= 0:
            return math.inf
        return (math.log(1 + self.change) - math.log(self.pass_bound)) / t_quantile(1 - self.beta, self.rounds - 1)

    def shown(self) -> tuple[float, float, float]:
        return shown(self.change, self.ci_low, self.ci_high, self.cost)

    def describe(self) -> str:
        what = self.verdict.word
        change, low, high = self.shown()
        if self.cost:
            return (f"{self.metric} (time per pass): {what}, candidate/base {change:+.1f}% "
                    f"({100 * (1 - 2 * self.alpha):.2f}% CI [{low:+.1f}%, {high:+.1f}%], {self.rounds} paired rounds; "
                    f"regression when significant and beyond +{1 / (1 - self.tolerance / 2) - 1:.1%}; "
                    "fails the gate, and keeps it looking while its estimate is beyond that)")
        line = (f"{self.metric}: {what}, candidate/base {change:+.1f}% "
                f"({100 * (1 - 2 * self.alpha):.2f}% CI [{low:+.1f}%, {high:+.1f}%], "
                f"{100 * (1 - self.beta):.1f}% lower bound {(self.pass_bound - 1) * 100:+.1f}%, "
                f"{self.rounds} paired rounds; regression when significant and beyond -{self.tolerance / 2:.1%}, "
                f"pass when -{self.tolerance / 2:.1%} is ruled out)")
        if self.verdict == Outcome.UNDECIDED:
            line += (f" -- at the cap the data allow neither a pass (no slowdown of {self.tolerance / 2:.1%}) nor a "
                     f"regression call: too noisy to tell a {self.tolerance:.0%} change from none "
                     "(raise --perf-max-repeats or use a quieter machine)")
        return line



def decide(metric: str, ratios: Sequence[float], design: Design, *, at_cap: bool, cost: bool = False) -> PairedDecision:
    """The verdict on one metric from its per-round ratios, below 1 when the candidate is slower
    (candidate / base for a rate; base / candidate for a phase's `cost`)."""
    d = [math.log(r) for r in ratios]
    n, tol = len(d), design.tolerance
    mean = statistics.fmean(d)
    if n < 2:
        verdict = Outcome.UNDECIDED if at_cap else Outcome.INCONCLUSIVE
        return PairedDecision(metric, verdict, math.exp(mean) - 1, 0.0, math.inf, 0.0, n, tol, design.alpha, design.beta,
                              cost)
    se = statistics.stdev(d) / math.sqrt(n)
    half = t_quantile(1 - design.alpha, n - 1) * se
    low, high = mean - half, mean + half
    pass_bound = mean - t_quantile(1 - design.beta, n - 1) * se
    if high < 0 and mean < math.log(1 - tol / 2):
        verdict = Outcome.REGRESSION
    elif low > 0 and mean > math.log(1 + tol / 2):
        verdict = Outcome.IMPROVEMENT
    elif pass_bound > math.log(1 - tol / 2):
        verdict = Outcome.PASS
    else:
        verdict = Outcome.UNDECIDED if at_cap else Outcome.INCONCLUSIVE
    return PairedDecision(metric, verdict, math.exp(mean) - 1, math.exp(low), math.exp(high), math.exp(pass_bound),
                          n, tol, design.alpha, design.beta, cost)
