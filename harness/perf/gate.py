"""The perf gate's measurement and verdicts, independent of pytest (harness/perf/plugin.py wires it in).

A combination is pair x precisions x platform x decoding x K, with an id that reads well:
    qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k6
A round runs every perf prompt once plain and once assisted, alternating which goes first
(ABBA over rounds), and yields one sample of plain tokens/s, assisted tokens/s and speedup
(their ratio inside the round, so machine drift cancels out of it).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from harness import __version__
from harness.core import descriptive, models, prompts
from harness.perf import stats
from harness.core.generate import measure_generation, ASSISTED, DecodeSettings, GenerationResult, PLAIN
from harness.core.registry import Matrix, PairSpec

log = logging.getLogger(__name__)

METRICS = ("speedup", "assisted_tokens_per_sec", "plain_tokens_per_sec")


@dataclass(frozen=True)
class Combination:
    pair: str
    target_precision: str
    draft_precision: str | None
    platform: str
    device: str
    decoding: str  # greedy | sampled
    k: int
    mode: str  # assisted | prompt-lookup
    slow: bool = False

    @property
    def precisions(self) -> str:
        return self.target_precision + (f"+{self.draft_precision}" if self.draft_precision else "")

    @property
    def id(self) -> str:
        return f"{self.pair}:{self.precisions}:{self.platform}:{self.decoding}:k{self.k}"

    @property
    def model_key(self) -> tuple[str, str, str | None, str]:
        """Combinations with the same key share loaded models."""
        return (self.pair, self.target_precision, self.draft_precision, self.device)


def combinations(matrix: Matrix) -> list[Combination]:
    out = []
    for entry in matrix.perf["combinations"]:
        pair = matrix.pair(entry["pair"])
        for spec in entry["precisions"]:
            target_p, _, draft_p = spec.partition("+")
            for platform in entry["platforms"]:
                for decoding in entry["decoding"]:
                    out.append(Combination(pair=pair.name, target_precision=target_p, draft_precision=draft_p or None,
                                           platform=platform, device=matrix.platform(platform).device,
                                           decoding=decoding, k=pair.num_assistant_tokens, mode=pair.mode,
                                           slow=entry.get("slow", False)))
    ids = [c.id for c in out]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup:
        raise ValueError(f"{matrix.path}: perf.combinations: {dup} is listed twice")
    return out


@dataclass(frozen=True)
class PerfSettings:
    max_new_tokens: int
    prompts: int
    rounds: int
    batch: int
    max_rounds: int
    drift_block: int
    tolerance_floor: float
    temperature: float
    top_p: float
    tolerance_override: float | None = None

    @classmethod
    def from_matrix(cls, matrix: Matrix, **overrides: Any) -> "PerfSettings":
        p = matrix.perf
        values = dict(max_new_tokens=p["max_new_tokens"], prompts=p["prompts"], rounds=p["rounds"],
                      batch=p["batch"], max_rounds=p["max_rounds"], drift_block=p["drift_block"],
                      tolerance_floor=p["tolerance_floor"],
                      temperature=p["sampling"]["temperature"], top_p=p["sampling"]["top_p"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def looks(self) -> int:
        return 1 + max(0, -(-(self.max_rounds - self.rounds) // self.batch))


@dataclass
class LoadedPair:
    key: tuple[str, str, str | None, str]
    target: models.LoadedModel
    draft: models.LoadedModel | None


class PlantedSlowdown:
    """Makes every forward pass of a model `fraction` slower by spinning after it (the gate's own
    check: `--perf-plant-slowdown`, benchmarks/gate_power.py). Spinning keeps the core busy, as
    slower code would. `fraction` may change between rounds (one model load for every level)."""

    def __init__(self, model: Any, fraction: float = 0.0):
        self.fraction = fraction

        def start(module: Any, args: Any) -> None:
            module._planted_t0 = time.perf_counter()

        def stop(module: Any, args: Any, output: Any) -> None:
            until = time.perf_counter() + (time.perf_counter() - module._planted_t0) * self.fraction
            while time.perf_counter() < until:
                pass

        model.register_forward_pre_hook(start)
        model.register_forward_hook(stop)


def load_pair(matrix: Matrix, combo: Combination, *, slowdown: float = 0.0, plant_into: str = "target") -> LoadedPair:
    """The pair's models at the combination's precisions; `slowdown` plants a slower forward pass
    into the target's or the draft's model (plant_into), to check the gate itself."""
    pair = matrix.pair(combo.pair)
    target = models.load(matrix.model(pair.target), combo.target_precision, combo.device)
    draft = None
    if combo.mode == ASSISTED:
        assert pair.draft and combo.draft_precision
        draft = models.load(matrix.model(pair.draft), combo.draft_precision, combo.device)
    if slowdown:
        victim = draft if plant_into == "draft" else target
        if victim is None:
            raise ValueError(f"{combo.id}: has no draft model to slow down (prompt lookup)")
        log.warning("planting a %.0f%% slowdown into %s's forward pass", slowdown * 100,
                    pair.draft if plant_into == "draft" else pair.target)
        PlantedSlowdown(victim.model, slowdown)
    return LoadedPair(combo.model_key, target, draft)


@dataclass
class Samples:
    plain_tokens_per_sec: list[float] = field(default_factory=list)
    assisted_tokens_per_sec: list[float] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    counters: list[dict[str, dict[str, int]]] = field(default_factory=list)  # per round: prompt -> counters

    def rounds(self) -> int:
        return len(self.speedup)

    def metric(self, name: str) -> list[float]:
        return getattr(self, name)


class Runner:
    """Measures one combination round by round."""

    def __init__(self, matrix: Matrix, combo: Combination, loaded: LoadedPair, settings: PerfSettings):
        self.combo, self.loaded, self.settings = combo, loaded, settings
        pair: PairSpec = matrix.pair(combo.pair)
        prompt_set = matrix.prompt_set(pair.prompt_set)
        self.prompts = prompts.load_prompts(prompt_set, loaded.target.tokenizer, limit=settings.prompts)
        self.inputs = [prompts.encode(p, loaded.target.tokenizer, chat_template=prompt_set.chat_template)
                       for p in self.prompts]
        sampled = combo.decoding == "sampled"
        # min == max new tokens: every run produces the same number of tokens
        self.decode = DecodeSettings(max_new_tokens=settings.max_new_tokens, min_new_tokens=settings.max_new_tokens,
                                     do_sample=sampled, temperature=settings.temperature if sampled else 1.0,
                                     top_p=settings.top_p if sampled else 1.0, num_assistant_tokens=combo.k,
                                     schedule=pair.schedule, confidence_threshold=pair.confidence_threshold)
        self.samples = Samples()

    def _run(self, mode: str, ids: Any, settings: DecodeSettings) -> GenerationResult:
        assistant = self.loaded.draft.model if (mode == ASSISTED and self.loaded.draft) else None
        return measure_generation(self.loaded.target.model, ids, settings, mode=mode, assistant=assistant)

    def warmup(self) -> None:
        warm = dataclasses.replace(self.decode, max_new_tokens=8, min_new_tokens=8)
        for mode in (PLAIN, self.combo.mode):
            self._run(mode, self.inputs[0], warm)

    def round(self) -> None:
        """One sample of every metric: each prompt plain and assisted, order alternating by round."""
        n = self.samples.rounds()
        order = (PLAIN, self.combo.mode) if n % 2 == 0 else (self.combo.mode, PLAIN)
        decode_s = {PLAIN: 0.0, self.combo.mode: 0.0}
        decode_tokens = {PLAIN: 0, self.combo.mode: 0}
        counters: dict[str, dict[str, int]] = {}
        for prompt, ids in zip(self.prompts, self.inputs):
            settings = dataclasses.replace(self.decode, seed=n)  # sampled: same seed for both modes
            for mode in order:
                r = self._run(mode, ids, settings)
                decode_s[mode] += r.decode_s
                decode_tokens[mode] += r.decode_tokens
                if mode != PLAIN:
                    counters[prompt.id] = {"new_tokens": r.new_tokens, "drafted": r.drafted or 0,
                                           "accepted": r.accepted or 0, "target_forwards": r.target_forwards}
        plain = decode_tokens[PLAIN] / decode_s[PLAIN]
        assisted = decode_tokens[self.combo.mode] / decode_s[self.combo.mode]
        self.samples.plain_tokens_per_sec.append(plain)
        self.samples.assisted_tokens_per_sec.append(assisted)
        self.samples.speedup.append(assisted / plain)
        self.samples.counters.append(counters)

    # ----------------------------------------------------------------------------------------
    def exact_counters(self) -> dict[str, dict[str, int]] | None:
        """Greedy runs are deterministic: every round's counters must agree; None for sampling."""
        if self.combo.decoding != "greedy" or not self.samples.counters:
            return None
        return self.samples.counters[0]

    def counters_stable(self) -> bool:
        return all(c == self.samples.counters[0] for c in self.samples.counters)

    def baseline_record(self, commit: str | None) -> dict[str, Any]:
        s, cap = self.settings, self.settings.max_rounds
        alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, s.looks())
        record: dict[str, Any] = {
            "pair": self.combo.pair, "target_precision": self.combo.target_precision,
            "draft_precision": self.combo.draft_precision, "mode": self.combo.mode,
            "decoding": self.combo.decoding, "k": self.combo.k, "prompt_ids": [p.id for p in self.prompts],
            "max_new_tokens": s.max_new_tokens,
        }
        tolerance: dict[str, Any] = {}
        for name in METRICS:
            values = self.samples.metric(name)
            drift, drift_df = stats.drift_sd(values, s.drift_block)
            record[name] = {"samples": [round(v, 6) for v in values], "median": round(descriptive.median(values), 6),
                            "cv": round(descriptive.cv(values) or 0.0, 6), "drift_sd": round(drift, 6),
                            "drift_df": drift_df, "block": s.drift_block}
            tolerance[name] = s.tolerance_override or stats.calibrated_tolerance(
                values, cap=cap, alpha=alpha, drift=drift, floor=s.tolerance_floor)
        tolerance["source"] = "override" if s.tolerance_override else "calibrated"
        import torch
        import transformers

        record.update(exact=self.exact_counters(), tolerance=tolerance,
                      versions={"torch": torch.__version__, "transformers": transformers.__version__,
                                "harness": __version__},
                      commit=commit, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        return record


@dataclass
class Verdict:
    combination: str
    exact: stats.ExactDecision | None
    decisions: dict[str, stats.GateDecision]
    rounds: int
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return (self.exact is not None and self.exact.verdict == stats.FAIL) or any(
            d.verdict == stats.FAIL for d in self.decisions.values())

    @property
    def undecided(self) -> list[stats.GateDecision]:
        return [d for d in self.decisions.values() if d.verdict == stats.UNDECIDED]

    @property
    def outcome(self) -> str:
        return "fail" if self.failed else "undecided" if self.undecided else "pass"

    def message(self, platform_id: str, baseline_file: str) -> str:
        what = "perf regression" if self.failed else "perf gate undecided"
        lines = [f"{what} in {self.combination} (platform {platform_id}, baseline {baseline_file}):"]
        if self.exact is not None and self.exact.verdict == stats.FAIL:
            lines.append("  " + self.exact.describe())
        for d in self.decisions.values():
            if d.verdict in (stats.FAIL, stats.UNDECIDED):
                lines.append("  " + d.describe())
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"If the change is intended, update this machine's baseline: "
                     f"pytest -m perf --update-baselines -k '{self.combination}' and commit {baseline_file}")
        return "\n".join(lines)


def tolerances(baseline: dict[str, Any], override: float | None) -> dict[str, float]:
    return {m: (override or baseline["tolerance"][m]) for m in METRICS}


def evaluate(runner: Runner, baseline: dict[str, Any]) -> Verdict:
    """All three gates. While a statistical gate is inconclusive, run more rounds (up to the cap)."""
    s = runner.settings
    notes = []
    exact = None
    if baseline.get("exact") is not None and runner.combo.decoding == "greedy":
        exact = stats.compare_exact(baseline["exact"], runner.exact_counters() or {})
        if not runner.counters_stable():
            exact = stats.ExactDecision(stats.FAIL, exact.differences + [
                "greedy counters changed between rounds in one process (nondeterministic decoding)"])
    tol = tolerances(baseline, s.tolerance_override)
    alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, s.looks())
    while True:
        at_cap = runner.samples.rounds() >= s.max_rounds
        decisions = {m: stats.compare_samples(m, baseline[m]["samples"], runner.samples.metric(m), tol[m],
                                              alpha=alpha, at_cap=at_cap, drift_sd=baseline[m]["drift_sd"]) for m in METRICS}
        if at_cap or all(d.verdict != stats.INCONCLUSIVE for d in decisions.values()):
            break
        pending = [m for m, d in decisions.items() if d.verdict == stats.INCONCLUSIVE]
        log.info("%s: %s inconclusive after %d rounds; %d more", runner.combo.id, ", ".join(pending),
                 runner.samples.rounds(), s.batch)
        for _ in range(min(s.batch, s.max_rounds - runner.samples.rounds())):
            runner.round()
    if any(d.verdict == stats.UNDECIDED for d in decisions.values()):
        notes.append(f"reached the cap of {s.max_rounds} rounds without a decision")
    return Verdict(runner.combo.id, exact, decisions, runner.samples.rounds(), notes)


def confirm(runner: Runner, baseline: dict[str, Any], first: Verdict) -> Verdict:
    """Re-measure a statistical FAIL once, with fresh rounds, before reporting it.

    A shared machine can run a whole gate slow: CI once measured a tiny model at 0.23x its baseline
    for every round of a run. The gate rightly decides FAIL on such a run. A regression of the
    code is there again in a second measurement; a burst of contention usually is not. So a
    metric fails only when it fails in both measurements. One that failed once and passed or
    stayed inconclusive the second time is UNDECIDED, with both measurements in its note.
    Exact-counter failures are deterministic and are never re-measured."""
    if not first.failed or (first.exact is not None and first.exact.verdict == stats.FAIL):
        return first
    log.warning("%s: %s failed; confirming with fresh rounds", runner.combo.id,
                ", ".join(m for m, d in first.decisions.items() if d.verdict == stats.FAIL))
    runner.samples = Samples()
    while runner.samples.rounds() < runner.settings.rounds:
        runner.round()
    second = evaluate(runner, baseline)
    decisions, notes = {}, list(second.notes)
    for m, d in second.decisions.items():
        was = first.decisions[m]
        if was.verdict == stats.FAIL and d.verdict != stats.FAIL:
            decisions[m] = dataclasses.replace(d, verdict=stats.UNDECIDED)
            notes.append(f"{m} failed in a first measurement ({(was.ratio - 1) * 100:+.1f}%, CI "
                         f"[{was.ci_low:.3f}, {was.ci_high:.3f}], {was.n_measured} rounds) and not in its "
                         f"confirmation ({(d.ratio - 1) * 100:+.1f}%): contention during the first?")
        else:
            decisions[m] = d
            if was.verdict == stats.FAIL:
                notes.append(f"{m}: the failure was confirmed by a second, independent measurement "
                             f"(first {(was.ratio - 1) * 100:+.1f}%, then {(d.ratio - 1) * 100:+.1f}%)")
    return Verdict(first.combination, second.exact, decisions, first.rounds + second.rounds, notes)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
