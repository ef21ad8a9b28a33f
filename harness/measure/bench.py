"""A benchmark run: plain and assisted decoding interleaved per prompt, K sweeps, repeats.

Data flow: selection (harness/workload/selection.py) -> models (+quant) -> prompts -> generate.measure_generation per
(prompt, configuration, repeat) -> per-prompt rows (medians) -> per-configuration summary.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from harness.core import descriptive
from harness.measure import interleave, phases
from harness.workload import fused_draft, models, prompts
from harness.workload.decode import DecodeSettings
from harness.core.errors import BadInputError, HarnessError
from harness.measure.generate import ASSISTED, PLAIN, measure_generation
from harness.machine.predict import StepCosts
from harness.core.progress import bar as progress_bar
from harness.measure.record import GenerationResult, Row, Summary
from harness.workload.registry import Matrix
from harness.workload.selection import Request, Selection, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Configuration:
    """One decoding configuration measured on every prompt: plain, or assisted with a K."""

    mode: str  # plain | assisted | prompt-lookup
    k: int | None = None
    reference: str | None = None  # plain decoding of the target at this other precision (--reference-precision)

    @property
    def label(self) -> str:
        if self.reference:
            return f"{self.mode} {self.reference}"
        return self.mode if self.k is None else f"{self.mode} k={self.k}"


@dataclass(frozen=True)
class BenchConfig:
    """A bench run: the resolved selection (what runs: harness/workload/selection.py) and how often."""

    selection: Selection
    run_plain: bool
    run_assisted: bool
    repeats: int = 1
    limit: int | None = None

    @property
    def reference(self) -> Configuration | None:
        """The plain arm at the reference precision, where one differs from the target's."""
        rp = self.selection.reference_precision
        return Configuration(PLAIN, reference=rp) if rp and rp != self.selection.target.precision else None

    def configurations(self) -> list[Configuration]:
        configs = [Configuration(PLAIN)] if self.run_plain else []
        if self.reference:
            configs.append(self.reference)
        if self.run_assisted:
            configs += [Configuration(self.selection.mode, k) for k in self.selection.ks]
        return configs


@dataclass
class BenchResult:
    config: BenchConfig
    target: dict[str, Any]
    draft: dict[str, Any] | None
    rows: list[Row]
    summary: list[Summary]
    costs: dict[int, StepCosts] = dataclasses.field(default_factory=dict)  # K -> step costs from the run
    reference: dict[str, Any] | None = None  # the target loaded at the reference precision

    def predicted(self, s: Summary) -> float | None:
        """The speedup the run's step costs predict for this configuration: per prompt, E / (d c + r)
        from that prompt's own passes, acceptance and d, the draft tokens a step drafted (K, or
        fewer where steps stop early: a confidence threshold, the text's end), then the median over
        prompts (as the measured speedup is). None without timed passes of both arms, and with
        --lookup-first (its lookup steps draft nothing and verify a lookup's tokens)."""
        rows = [r for r in self.rows if r.configuration == s.configuration]
        if s.mode != ASSISTED or s.k is None or any(x.get("lookup_per_step") is not None
                                                    for r in rows for x in r.samples):
            return None
        plain = {r.prompt_id: r for r in self.rows if r.configuration == Configuration(PLAIN).label}
        found = []
        for row in rows:
            costs = phases.step_costs(_row_phases(plain[row.prompt_id]) if row.prompt_id in plain else None,
                                _row_phases(row), s.k)
            if costs and row.mean_accepted_length:
                drafted = row.drafted / row.target_forwards if row.drafted is not None and row.target_forwards else None
                found.append(costs.predict(row.mean_accepted_length, drafted))
        return descriptive.median(found) if found else None


def build_config(matrix: Matrix, request: Request, *, mode: str = "compare", repeats: int | None = None,
                 limit: int | None = None) -> BenchConfig:
    """The selection (resolved once) and bench's own settings: which arms, repeats, a prompt limit."""
    return BenchConfig(selection=resolve(matrix, request), run_plain=mode in ("compare", "plain"),
                       run_assisted=mode in ("compare", "assisted"),
                       repeats=repeats or matrix.defaults.repeats, limit=limit)


def _loaded_info(m: models.LoadedModel) -> dict[str, Any]:
    return {"name": m.name, "precision": m.precision, "path": str(m.path), "load_s": round(m.load_s, 2),
            "parameters": sum(p.numel() for p in m.model.parameters()), "quantization": m.quant_record,
            "draft_head": m.draft_head, "attention": m.attention}


def run_bench(cfg: BenchConfig, *, progress: bool = True) -> BenchResult:
    sel = cfg.selection
    attention = sel.attention.implementation
    target = models.load(sel.target.spec, sel.target.precision, sel.device, attention=attention)
    reference = None
    if cfg.reference:
        try:
            reference = models.load(sel.target.spec, cfg.reference.reference, sel.device, attention=attention)
        except HarnessError as exc:  # the same kind, named by the option that asked for it
            exc.args = (f"--reference-precision {cfg.reference.reference}: {exc}", *exc.args[1:])
            raise
    draft = None
    if cfg.run_assisted and sel.draft is not None:
        draft = models.load(sel.draft.spec, sel.draft.precision, sel.device, draft_vocab=sel.draft.draft_vocab,
                            attention=attention)
        if sel.decode.fused_draft:
            try:  # built here once, so that an architecture the loop cannot run is named before any run
                fused_draft.fused(draft.model)
            except ValueError as exc:
                raise BadInputError(f"--fused-draft: draft {sel.draft.name}: {exc}") from None
    prompt_list = prompts.load_prompts(sel.prompt_set, target.tokenizer, limit=cfg.limit)
    encoded = [prompts.encode(p, target.tokenizer, chat_template=sel.prompt_set.chat_template) for p in prompt_list]
    configs = cfg.configurations()

    def run(config: Configuration, ids: torch.LongTensor, settings: DecodeSettings) -> GenerationResult:
        model = reference.model if (reference and config.reference) else target.model
        return measure_generation(model, ids, settings, mode=config.mode, k=config.k,
                                  assistant=draft.model if (draft and config.mode == ASSISTED) else None,
                                  tokenizer=target.tokenizer)

    interleave.warm_up(configs, run, encoded, sel.decode, device=sel.device)

    samples: dict[tuple[int, Configuration], list[GenerationResult]] = {}
    bar = progress_bar(total=len(encoded) * cfg.repeats * len(configs), desc=f"bench {sel.pair}",
                       unit="run", enabled=progress)
    for i, ids in enumerate(encoded):
        for r in range(cfg.repeats):
            for config in interleave.abba(configs, r):  # plain and assisted alternate within each prompt
                result = run(config, ids, sel.decode)
                samples.setdefault((i, config), []).append(result)
                bar.set_postfix_str(f"{prompt_list[i].id} {config.label} "
                                    f"{result.tokens_per_sec or 0:.1f} tok/s")
                bar.update()
    bar.close()
    info_t = _loaded_info(target)
    info_d = _loaded_info(draft) if draft else None

    rows = _rows(prompt_list, configs, samples, cfg.repeats, cfg.reference)
    summary = summarize(rows, configs)
    costs = step_costs(summary)
    for k, c in costs.items():
        log.info("step costs at K=%d from the run: target %.1f ms, %d tokens %.1f ms (r=%.2f), draft %.1f ms (c=%.2f)",
                 k, c.target_ms, k + 1, c.verify_ms, c.r, c.draft_ms or 0.0, c.c)
    return BenchResult(config=cfg, target=info_t, draft=info_d, rows=rows, summary=summary,
                       costs=costs, reference=_loaded_info(reference) if reference else None)


def step_costs(summary: list[Summary]) -> dict[int, StepCosts]:
    """K -> the step costs the run itself measured over all prompts: the plain arm's one-token
    step, the assisted arm's verification and draft step. Empty without both arms timed."""
    plain = next((s for s in summary if s.mode == PLAIN and s.phases), None)
    found = {s.k: phases.step_costs(plain.phases if plain else None, s.phases, s.k)
             for s in summary if s.mode == ASSISTED and s.k is not None}
    return {k: c for k, c in found.items() if c is not None}


def _row_phases(row: Row) -> dict[str, phases.PhaseCost] | None:
    """One prompt's phases over its repeats; None where its passes were not timed."""
    runs = [GenerationResult.from_sample(row.mode, d) for d in row.samples]
    return phases.pooled(r.phases for r in runs) if runs and all(r.phases for r in runs) else None


def _paired_speedup(base: list[GenerationResult], runs: list[GenerationResult]) -> float | None:
    """Median over repeats of base/run time per token, the r-th run of each (the same ABBA slot)."""
    return descriptive.median([descriptive.ratio(a.time_per_token_ms, b.time_per_token_ms) for a, b in zip(base, runs)])


def _rows(prompt_list: list[prompts.Prompt], configs: list[Configuration],
          samples: dict[tuple[int, Configuration], list[GenerationResult]], repeats: int,
          reference: Configuration | None = None) -> list[Row]:
    rows = []
    plain = Configuration(PLAIN)
    for i, p in enumerate(prompt_list):
        plain_runs = samples.get((i, plain))
        reference_runs = samples.get((i, reference)) if reference else None
        for config in configs:
            runs = samples[(i, config)]
            speedup = speedup_ref = None
            same = None
            if config.mode != PLAIN and plain_runs:
                speedup = _paired_speedup(plain_runs, runs)
                same = all(a.tokens == b.tokens for a, b in zip(plain_runs, runs))
            if config.mode != PLAIN and reference_runs:
                speedup_ref = _paired_speedup(reference_runs, runs)
            med = lambda attr: descriptive.median([getattr(x, attr) for x in runs])  # noqa: E731
            first = runs[0]
            rows.append(Row(
                example=i + 1, prompt_id=p.id, configuration=config.label, mode=config.mode, k=config.k,
                prompt_tokens=first.prompt_tokens, new_tokens=int(med("new_tokens")), total_s=med("total_s"),
                prefill_ms=med("prefill_ms"), time_per_token_ms=med("time_per_token_ms"),
                tokens_per_sec=med("tokens_per_sec"),
                drafted=first.drafted if repeats == 1 else _int_median(runs, "drafted"),
                accepted=first.accepted if repeats == 1 else _int_median(runs, "accepted"),
                mean_accepted_length=med("mean_accepted_length") if config.mode != PLAIN else None,
                target_forwards=_int_median(runs, "target_forwards"), speedup=speedup,
                speedup_vs_reference=speedup_ref, cpu_s=med("cpu_s"),
                same_tokens_as_plain=same,
                samples=[r.sample() for r in runs],
            ))
    return rows


def _int_median(runs: list[GenerationResult], attr: str) -> int | None:
    m = descriptive.median([getattr(r, attr) for r in runs])
    return None if m is None else int(round(m))


def summarize(rows: list[Row], configs: list[Configuration]) -> list[Summary]:
    out = []
    for config in configs:
        mine = [r for r in rows if r.configuration == config.label]
        drafted = sum(r.drafted or 0 for r in mine)
        assisted = config.mode != PLAIN
        forwards = sum(r.target_forwards for r in mine)
        out.append(Summary(
            configuration=config.label, mode=config.mode, k=config.k, prompts=len(mine),
            median_tokens_per_sec=descriptive.median([r.tokens_per_sec for r in mine]),
            median_time_per_token_ms=descriptive.median([r.time_per_token_ms for r in mine]),
            median_speedup=descriptive.median([r.speedup for r in mine]) if assisted else None,
            median_speedup_vs_reference=(descriptive.median([r.speedup_vs_reference for r in mine])
                                         if assisted and any(r.speedup_vs_reference for r in mine) else None),
            acceptance_rate=(sum(r.accepted or 0 for r in mine) / drafted) if assisted and drafted else None,
            mean_accepted_length=(sum(r.new_tokens for r in mine) / forwards) if assisted and forwards else None,
            prompts_same_tokens_as_plain=(sum(bool(r.same_tokens_as_plain) for r in mine)
                                          if assisted and any(r.same_tokens_as_plain is not None for r in mine)
                                          else None),
            **_phase_fields([GenerationResult.from_sample(r.mode, d) for r in mine for d in r.samples], assisted),
        ))
    return out


def _phase_fields(runs: list[GenerationResult], assisted: bool) -> dict[str, Any]:
    """A configuration's pooled phases, the accounting of its decode phase and (assisted) the
    acceptance by drafted position; nothing where the passes were not timed (a GPU)."""
    out: dict[str, Any] = {}
    timed = [r for r in runs if r.phases]
    if timed and len(timed) == len(runs):
        out["phases"] = phases.pooled(r.phases for r in timed)
        out["accounting"] = phases.combined(phases.accounting(r.phases, r.decode_tokens, r.decode_s * 1000.0)
                                            for r in timed)
    if assisted and runs and all(r.drafted_per_step is not None for r in runs):
        steps = [r.draft_steps() for r in runs]
        out["acceptance_by_position"] = phases.acceptance_by_position([d for d, _ in steps], [a for _, a in steps])
    return out
