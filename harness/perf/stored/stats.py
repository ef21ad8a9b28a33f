"""Statistics of repeated measurements and the perf gate's decisions.

All three gates live here, from no noise to most noise:
  exact      counters (accepted/drafted/target forwards per prompt) equal the stored ones
  relative   speedup samples (plain/assisted, interleaved in one process) against the baseline's
  absolute   tokens/s samples against the baseline's

The relative and absolute gates use one rule, `compare_samples`: an indifference-zone test on
log ratios. With tolerance t, a slowdown of t or more must fail and no change must pass; the
decision threshold sits in the middle, at a ratio of 1 - t/2:
  regression    the whole (1 - alpha) confidence interval of the ratio is below 1 - t/2
  pass          the whole interval is above 1 - t/2
  inconclusive  the interval contains it: the caller takes more samples, up to a cap
  undecided     still so at the cap: the machine was too noisy to resolve t. Never a silent
                pass: the plugin reports it loudly and `--perf-undecided=fail` fails on it.

Two kinds of noise (a random-effects model on log samples):
  within a run    round-to-round spread; shrinks as rounds are added
  between runs    the level of the whole run moves (a shared host's load, frequency, memory
                  placement). It does not shrink with more rounds of the run being judged, so it
                  enters the interval as a fixed variance 2 * drift_sd**2 (two runs' levels).
                  `drift_sd` is estimated when a baseline is written, from how much the means of
                  consecutive blocks of its rounds move beyond what the within-run spread explains.
The tolerance a baseline carries is calibrated so that, at the cap, both ends of the
indifference zone are resolved: half the tolerance covers (t_alpha + z_beta) standard errors.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.perf.errorrates import normal_quantile, split, t_quantile
from harness.perf.outcome import Outcome

DEFAULT_ALPHA = 0.01  # one-sided error rate of each decision, split over the looks at the data
DEFAULT_BETA = 0.05  # at the calibrated tolerance: chance that a change of the full tolerance is not resolved


@dataclass
class GateDecision:
    metric: str
    verdict: Outcome  # PASS, REGRESSION, INCONCLUSIVE or UNDECIDED
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
    drift_sd: float = 0.0  # between-run spread of the log level that the interval includes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        change = (self.ratio - 1) * 100
        how = (f" -- UNDECIDED at the cap of {self.n_measured} rounds: this machine is too noisy to tell a "
               f"{self.tolerance:.0%} change from none (raise --perf-max-repeats, use a quieter machine, or widen "
               f"--perf-tolerance)") if self.verdict == Outcome.UNDECIDED else ""
        drift = f", between-run spread {self.drift_sd:.1%}" if self.drift_sd else ""
        return (f"{self.metric}: baseline median {self.baseline_median:.4g}, measured median "
                f"{self.measured_median:.4g} ({change:+.1f}%, {100 * (1 - self.alpha):.1f}% CI of the ratio "
                f"[{self.ci_low:.3f}, {self.ci_high:.3f}]), tolerance {self.tolerance:.0%} (fails below a ratio "
                f"of {self.threshold:.3f}), Welch t = {self.t_statistic:.2f} (df {self.df:.1f}), "
                f"n = {self.n_measured} measured vs {self.n_baseline} baseline{drift}{how}")


def _logs(values: Sequence[float | None]) -> list[float]:
    return [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]


def compare_samples(metric: str, baseline: Sequence[float], measured: Sequence[float], tolerance: float,
                    *, alpha: float = DEFAULT_ALPHA, at_cap: bool = False, drift_sd: float = 0.0) -> GateDecision:
    """The indifference-zone decision for a higher-is-better metric (module docstring).

    drift_sd: the between-run spread of the metric's log level, taken as known (a plug-in
    estimate: with the few blocks one baseline run has, a t-penalty for its own uncertainty would
    push every tolerance to the ceiling; tests/unit/test_gate_stats.py measures the error rates
    this gives when the runs really drift)."""
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be within (0, 1); got {tolerance}")
    b, m = _logs(baseline), _logs(measured)
    if len(b) < 2 or len(m) < 2:
        raise ValueError(f"{metric}: need at least 2 positive samples on each side "
                         f"(baseline {len(b)}, measured {len(m)})")
    mb, mm = statistics.fmean(b), statistics.fmean(m)
    vb, vm, vd = statistics.variance(b) / len(b), statistics.variance(m) / len(m), 2 * drift_sd ** 2
    se = math.sqrt(vb + vm + vd)
    diff = mm - mb
    if se == 0:
        df, t_stat, half = float(len(b) + len(m) - 2), (math.inf if diff > 0 else -math.inf if diff < 0 else 0.0), 0.0
    else:  # Welch-Satterthwaite over the sampled components; the drift variance is taken as known
        parts = (vb ** 2) / (len(b) - 1) + (vm ** 2) / (len(m) - 1)
        df = (vb + vm) ** 2 / parts if parts > 0 else float(len(b) + len(m) - 2)
        t_stat = diff / se
        half = t_quantile(1 - alpha, df) * se
    lo, hi = math.exp(diff - half), math.exp(diff + half)
    threshold = 1 - tolerance / 2
    if hi < threshold:
        verdict = Outcome.REGRESSION
    elif lo > threshold:
        verdict = Outcome.PASS
    else:
        verdict = Outcome.UNDECIDED if at_cap else Outcome.INCONCLUSIVE
    return GateDecision(metric=metric, verdict=verdict, baseline_median=statistics.median(math.exp(x) for x in b),
                        measured_median=statistics.median(math.exp(x) for x in m), ratio=math.exp(diff), ci_low=lo,
                        ci_high=hi, threshold=threshold, tolerance=tolerance, t_statistic=t_stat, df=df, alpha=alpha,
                        n_baseline=len(b), n_measured=len(m), drift_sd=drift_sd)


def drift_sd(samples: Sequence[float], block: int) -> tuple[float, int]:
    """Between-run spread of the log level, from consecutive blocks of `block` rounds, and its
    degrees of freedom: the variance of the block means beyond what within-block spread explains
    (a one-way random-effects estimate, floored at 0). Fewer than two whole blocks: (0, 0)."""
    logs = _logs(samples)
    k = len(logs) // block if block >= 2 else 0
    if k < 2:
        return 0.0, 0
    blocks = [logs[i * block:(i + 1) * block] for i in range(k)]
    within = statistics.fmean(statistics.variance(bl) for bl in blocks)
    between = statistics.variance(statistics.fmean(bl) for bl in blocks)
    return math.sqrt(max(0.0, between - within / block)), k - 1


def alpha_per_look(alpha: float, looks: int) -> float:
    """Bonferroni split of the error rate over the sequential looks at the data."""
    return split(alpha, looks)


def calibrated_tolerance(samples: Sequence[float], *, cap: int, alpha: float = DEFAULT_ALPHA,
                         beta: float = DEFAULT_BETA, drift: float = 0.0, floor: float = 0.05,
                         ceiling: float = 0.5) -> float:
    """The smallest tolerance this machine's spread lets the gate resolve with `cap` rounds: half
    of it (in log ratio) must hold (t_alpha + z_beta) standard errors of the comparison at the cap,
    so that no change passes and a change of the whole tolerance fails, each with the stated
    error rates. Rounded up to whole percent, within [floor, ceiling]."""
    logs = _logs(samples)
    if len(logs) < 2:
        return floor
    sd, n = statistics.stdev(logs), len(logs)
    vs, vd = sd * sd * (1 / n + 1 / cap), 2 * drift * drift
    parts = (sd * sd / n) ** 2 / (n - 1) + (sd * sd / cap) ** 2 / (cap - 1)
    df = vs ** 2 / parts if parts > 0 else n + cap - 2
    half = (t_quantile(1 - alpha, df) + normal_quantile(1 - beta)) * math.sqrt(vs + vd)
    tol = 2 * (1 - math.exp(-half))
    return min(ceiling, max(floor, math.ceil(tol * 100) / 100))


@dataclass
class ExactDecision:
    verdict: Outcome  # PASS or REGRESSION
    differences: list[str]

    def describe(self) -> str:
        return "exact counters: " + ("equal to the baseline" if self.verdict == Outcome.PASS
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
    return ExactDecision(Outcome.PASS if not diffs else Outcome.REGRESSION, diffs)
