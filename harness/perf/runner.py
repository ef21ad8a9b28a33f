"""Measuring one combination round by round, and what a baseline stores of it.

A round runs every perf prompt once plain and once assisted, in ABBA order over rounds
(harness/measure/interleave.py), and yields one sample of plain tokens/s, assisted tokens/s and
speedup (their ratio inside the round, so machine drift cancels out of it).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.core import descriptive, timing
from harness.machine import provenance
from harness.measure import interleave, phases
from harness.perf import plant
from harness.workload import models, prompts
from harness.machine.provenance import software_versions
from harness.workload.decode import ASSISTED, PLAIN, DecodeSettings
from harness.measure.record import GenerationResult
from harness.perf.stored import stats
from harness.perf.combinations import Combination, PerfSettings
from harness.perf.record import ASSISTED_PHASES, METRICS, PLAIN_PHASES, Round, Samples

log = logging.getLogger(__name__)

@dataclass
class LoadedPair:
    key: tuple[str, str, str | None, str]
    target: models.LoadedModel
    draft: models.LoadedModel | None


def load_pair(combo: Combination, *, slowdown: float = 0.0, plant_into: str = "target") -> LoadedPair:
    """The selection's models; `slowdown` plants a slower forward pass into the target's or the
    draft's model, the target's verification passes, or the host work before each verification
    (plant_into: harness/perf/plant.py PLANT_INTO), to check the gate itself."""
    sel = combo.selection
    attention = sel.attention.implementation
    target = models.load(sel.target.spec, sel.target.precision, sel.device, attention=attention)
    draft = None
    if sel.draft is not None:
        draft = models.load(sel.draft.spec, sel.draft.precision, sel.device, draft_vocab=sel.draft.draft_vocab,
                            attention=attention)
    if slowdown:
        victim = draft if plant_into == "draft" else target
        if victim is None:
            raise ValueError(f"{combo.id}: has no draft model to slow down (prompt lookup)")
        where = plant.plant(target.model, draft.model if draft else None, plant_into, slowdown,
                            fused_draft=sel.decode.fused_draft)
        log.warning("planted %.1f%% into %s (%s)", slowdown * 100, where, victim.name)
    return LoadedPair(combo.model_key, target, draft)


class Runner:
    """Measures one combination round by round."""

    measures = True  # its rounds are fresh measurements (a replay's are not: nothing to confirm with)

    def __init__(self, combo: Combination, loaded: LoadedPair | None, settings: PerfSettings, tokenizer: Any = None):
        """`loaded`: the pair that runs the rounds; a runner that measures nothing (a replay) passes
        None and the target's `tokenizer`, which reads the prompts the baseline's settings are checked on."""
        self.combo, self.loaded, self.settings = combo, loaded, settings
        tokenizer = loaded.target.tokenizer if loaded is not None else tokenizer
        prompt_set = combo.selection.prompt_set
        self.prompts = prompts.load_prompts(prompt_set, tokenizer, limit=settings.prompts)
        self.inputs = [prompts.encode(p, tokenizer, chat_template=prompt_set.chat_template) for p in self.prompts]
        self.decode = combo.selection.decode  # fixed length: every run produces the same number of tokens
        self.samples = Samples()

    def _run(self, mode: str, ids: Any, settings: DecodeSettings) -> GenerationResult:
        from harness.measure.generate import measure_generation  # torch: imported once a model runs, not by the plugin

        assert self.loaded is not None, "a runner without models measures nothing"
        assistant = self.loaded.draft.model if (mode == ASSISTED and self.loaded.draft) else None
        return measure_generation(self.loaded.target.model, ids, settings, mode=mode,
                                  k=None if mode == PLAIN else self.combo.k, assistant=assistant)

    def warmup(self) -> None:
        interleave.warm_up((PLAIN, self.combo.mode), self._run, self.inputs, self.decode, device=self.combo.device,
                           full=(self.combo.mode,),  # it verifies several tokens a pass
                           cycles=2)  # until the allocator's heap stops growing

    def round(self, between: Callable[[int, int], None] | None = None) -> Round:
        """One sample of every metric: each prompt plain and assisted, order alternating by round.
        `between(k, n)` is called after the k-th of its n runs (k from 1), but the last: side by side,
        the worker waits there for the other arm (harness/perf/ab/worker.py). The tokens/s and the
        phases time the runs only; the round's wall time holds the waits too."""
        n = self.samples.rounds()
        order = interleave.abba((PLAIN, self.combo.mode), n)
        decode_s = {PLAIN: 0.0, self.combo.mode: 0.0}
        decode_tokens = {PLAIN: 0, self.combo.mode: 0}
        counters: dict[str, dict[str, int]] = {}
        runs: dict[str, list[GenerationResult]] = {PLAIN: [], self.combo.mode: []}
        total, done_runs = len(self.prompts) * len(order), 0
        cpu0, t0, faults0 = time.process_time(), time.perf_counter(), timing.thread_page_faults()
        for prompt, ids in zip(self.prompts, self.inputs):
            settings = dataclasses.replace(self.decode, seed=n)  # sampled: same seed for both modes
            for mode in order:
                r = self._run(mode, ids, settings)
                done_runs += 1
                if between is not None and done_runs < total:
                    between(done_runs, total)
                runs[mode].append(r)
                decode_s[mode] += r.decode_s
                decode_tokens[mode] += r.decode_tokens
                if mode != PLAIN:
                    counters[prompt.id] = {"new_tokens": r.new_tokens, "drafted": r.drafted or 0,
                                           "accepted": r.accepted or 0, "target_forwards": r.target_forwards}
        faults1 = timing.thread_page_faults()
        plain = decode_tokens[PLAIN] / decode_s[PLAIN]
        assisted = decode_tokens[self.combo.mode] / decode_s[self.combo.mode]
        done = Round(plain_tokens_per_sec=plain, assisted_tokens_per_sec=assisted, speedup=assisted / plain,
                     counters=counters, cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - t0,
                     page_faults=None if faults0 is None else faults1 - faults0,  # both None or neither
                     **round_phases(runs[PLAIN], runs[self.combo.mode]))
        self.samples.add(done)
        return done

    def rounds_left(self) -> int:
        """Rounds this runner may still run before the cap."""
        return self.settings.max_rounds - self.samples.rounds()

    # ----------------------------------------------------------------------------------------
    def exact_counters(self) -> dict[str, dict[str, int]] | None:
        """Greedy runs are deterministic: every round's counters must agree; None for sampling."""
        if self.combo.decoding != "greedy" or not self.samples.counters:
            return None
        return self.samples.counters[0]

    def counters_stable(self) -> bool:
        return all(c == self.samples.counters[0] for c in self.samples.counters)

    def decode_record(self) -> dict[str, Any]:
        """The decoding settings a baseline must share with a run that is compared against it."""
        d = self.decode
        return {"min_new_tokens": d.min_new_tokens, "do_sample": d.do_sample, "temperature": d.temperature,
                "top_p": d.top_p, "schedule": d.schedule, "confidence_threshold": d.confidence_threshold,
                "lookup_first": d.lookup_first, "fused_draft": d.fused_draft}

    def baseline_record(self, commit: str | None) -> dict[str, Any]:
        s, cap = self.settings, self.settings.max_rounds
        alpha = stats.alpha_per_look(stats.DEFAULT_ALPHA, s.looks())
        record: dict[str, Any] = {
            "pair": self.combo.pair, "target_precision": self.combo.target_precision,
            "draft_precision": self.combo.draft_precision, "mode": self.combo.mode,
            "decoding": self.combo.decoding, "k": self.combo.k, "prompt_ids": [p.id for p in self.prompts],
            "max_new_tokens": s.max_new_tokens, "decode": self.decode_record(),
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
        record.update(exact=self.exact_counters(), tolerance=tolerance, versions=software_versions(),
                      commit=commit, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        return record


def round_phases(plain: list[GenerationResult], assisted: list[GenerationResult]) -> dict[str, Any]:
    """A round's phases (record.ROUND_PHASES: each arm's own, pooled over its prompts) and its
    acceptance by drafted position; nothing where the passes were not timed (a GPU)."""
    out: dict[str, Any] = {}
    if all(r.phases for r in plain + assisted):
        mine = {**{k: v for k, v in phases.pooled(r.phases for r in plain).items() if k in PLAIN_PHASES},
                **{k: v for k, v in phases.pooled(r.phases for r in assisted).items() if k in ASSISTED_PHASES}}
        out["phases"] = mine or None
    if assisted and all(r.drafted_per_step is not None for r in assisted):
        steps = [r.draft_steps() for r in assisted]
        out["acceptance_by_position"] = phases.acceptance_by_position([d for d, _ in steps], [a for _, a in steps])
    return out


def git_commit() -> str | None:
    """HEAD's sha in 12 characters, as a baseline record keeps it (harness/machine/provenance.py)."""
    commit, _ = provenance.git_state()
    return commit[:12] if commit else None
