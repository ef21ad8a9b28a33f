"""Statistics of repeated measurements and the perf gate's decisions.

All three gates live here (DESIGN.md), from no noise to most noise:
  exact      counters (accepted/drafted/target forwards per prompt) equal the stored ones
  relative   speedup samples (plain/assisted, interleaved in one process) against the baseline's
  absolute   tokens/s samples against the baseline's

The relative and absolute gates use one rule, `compare_samples`: an indifference-zone test on
log ratios. With tolerance t, a slowdown of t or more must fail and no change must pass; the
decision threshold sits in the middle, at a ratio of 1 - t/2:
  fail          the whole (1 - alpha) confidence interval of the ratio is below 1 - t/2
  pass          the whole interval is above 1 - t/2
  inconclusive  the interval contains it: the caller takes more samples, up to a cap, and at the
                cap decides by the point estimate, saying so (`decided_at_cap`): never a silent pass.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
DEFAULT_ALPHA = 0.01  # one-sided error rate of each decision, split over the looks at the data


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def cv(values: Sequence[float | None]) -> float | None:
    """Coefficient of variation (sample stdev / mean); None for fewer than two values."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return statistics.stdev(vals) / statistics.fmean(vals)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _t_quantile(p: float, df: float) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass
class GateDecision:
    metric: str
    verdict: str  # pass | fail | inconclusive
    baseline_median: float
    measured_median: float
    ratio: float  # geometric-mean ratio measured / baseline (higher is better for every gated metric)
    ci_low: float
    ci_high: float
    threshold: float  # 1 - tolerance / 2
    tolerance: float
    t_statistic: float
    df: float
    alpha: float
    n_baseline: int
    n_measured: int
    decided_at_cap: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        change = (self.ratio - 1) * 100
        how = " (decided by the point estimate at the sample cap: the machine was too noisy to be sure)" \
            if self.decided_at_cap else ""
        return (f"{self.metric}: baseline median {self.baseline_median:.4g}, measured median "
                f"{self.measured_median:.4g} ({change:+.1f}%, {100 * (1 - self.alpha):.1f}% CI of the ratio "
                f"[{self.ci_low:.3f}, {self.ci_high:.3f}]), tolerance {self.tolerance:.0%} (fails below a ratio "
                f"of {self.threshold:.3f}), Welch t = {self.t_statistic:.2f} (df {self.df:.1f}), "
                f"n = {self.n_measured} measured vs {self.n_baseline} baseline{how}")


def compare_samples(metric: str, baseline: Sequence[float], measured: Sequence[float], tolerance: float,
                    *, alpha: float = DEFAULT_ALPHA, at_cap: bool = False) -> GateDecision:
    """The indifference-zone decision for a higher-is-better metric (module docstring)."""
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be within (0, 1); got {tolerance}")
    b = [math.log(v) for v in baseline if v is not None and v > 0 and math.isfinite(v)]
    m = [math.log(v) for v in measured if v is not None and v > 0 and math.isfinite(v)]
    if len(b) < 2 or len(m) < 2:
        raise ValueError(f"{metric}: need at least 2 positive samples on each side "
                         f"(baseline {len(b)}, measured {len(m)})")
    mb, mm = statistics.fmean(b), statistics.fmean(m)
    vb, vm = statistics.variance(b) / len(b), statistics.variance(m) / len(m)
    se = math.sqrt(vb + vm)
    diff = mm - mb
    if se == 0:
        df, t_stat, half = float(len(b) + len(m) - 2), (math.inf if diff > 0 else -math.inf if diff < 0 else 0.0), 0.0
    else:
        df = (vb + vm) ** 2 / ((vb ** 2) / (len(b) - 1) + (vm ** 2) / (len(m) - 1))
        t_stat = diff / se
        half = _t_quantile(1 - alpha, df) * se
    lo, hi = math.exp(diff - half), math.exp(diff + half)
    threshold = 1 - tolerance / 2
    est = math.exp(diff)
    resolved = hi < threshold or lo > threshold
    if resolved:
        verdict = FAIL if hi < threshold else PASS
    elif at_cap:
        verdict = FAIL if est < threshold else PASS
    else:
        verdict = INCONCLUSIVE
    return GateDecision(metric=metric, verdict=verdict, baseline_median=statistics.median(math.exp(x) for x in b),
                        measured_median=statistics.median(math.exp(x) for x in m), ratio=est, ci_low=lo, ci_high=hi,
                        threshold=threshold, tolerance=tolerance, t_statistic=t_stat, df=df, alpha=alpha,
                        n_baseline=len(b), n_measured=len(m), decided_at_cap=at_cap and not resolved)


def alpha_per_look(alpha: float, looks: int) -> float:
    """Bonferroni split of the error rate over the sequential looks at the data."""
    return alpha / max(1, looks)


def calibrated_tolerance(samples: Sequence[float], *, cap: int, alpha: float = DEFAULT_ALPHA,
                         floor: float = 0.05, ceiling: float = 0.5) -> float:
    """The smallest tolerance this machine's spread lets the gate resolve with `cap` samples:
    at the cap, the confidence interval's half-width (in log ratio) must fit in half the
    tolerance. Rounded up to whole percent, within [floor, ceiling]."""
    logs = [math.log(v) for v in samples if v and v > 0]
    if len(logs) < 2:
        return floor
    sd = statistics.stdev(logs)
    n = len(logs)
    half = _t_quantile(1 - alpha, n + cap - 2) * sd * math.sqrt(1 / n + 1 / cap)
    tol = 2 * (1 - math.exp(-half))
    return min(ceiling, max(floor, math.ceil(tol * 100) / 100))


@dataclass
class ExactDecision:
    verdict: str  # pass | fail
    differences: list[str]

    def describe(self) -> str:
        return "exact counters: " + ("equal to the baseline" if self.verdict == PASS
                                     else "; ".join(self.differences))


def compare_exact(baseline: Mapping[str, Mapping[str, int]], measured: Mapping[str, Mapping[str, int]]) -> ExactDecision:
    """Per-prompt counters (accepted, drafted, target_forwards, new_tokens) must be equal."""
    diffs = []
    for prompt_id in sorted(set(baseline) | set(measured)):
        if prompt_id not in measured:
            diffs.append(f"{prompt_id}: in the baseline, not measured")
            continue
        if prompt_id not in baseline:
            diffs.append(f"{prompt_id}: measured, not in the baseline")
            continue
        for key in sorted(set(baseline[prompt_id]) | set(measured[prompt_id])):
            b, m = baseline[prompt_id].get(key), measured[prompt_id].get(key)
            if b != m:
                diffs.append(f"{prompt_id} {key}: baseline {b}, measured {m}")
    return ExactDecision(PASS if not diffs else FAIL, diffs)
