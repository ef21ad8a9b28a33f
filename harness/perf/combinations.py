"""The perf gate's combinations: pair x precisions x platform x decoding x K, from matrix.toml's
[perf] table, with an id that reads well:
    qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k6
(with :vN for a restricted draft vocabulary, :attn-NAME for an attention implementation other than
transformers' default, and the drafting choices a CPU class or preset makes: :fused for the fused draft
loop, :cN for a confidence threshold, :lookupN for a prompt lookup before the draft; two combinations
that run differently never share an id) and the gate's settings (rounds, cap, tolerance floor,
sampling) from the same table. `of_pair` resolves one pair as the merge gate does, for the benchmarks
that measure the gate.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from harness.core.errors import RegistryError
from harness.workload.registry import CHOSEN, Matrix
from harness.workload.selection import Request, Selection, resolve
from harness.perf.ab import paired

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Combination:
    """One perf combination: a resolved selection (what runs: harness/workload/selection.py), its decoding
    and whether it is slow. Every other field reads the selection."""

    selection: Selection
    decoding: str  # greedy | sampled
    slow: bool = False

    pair = property(lambda self: self.selection.pair)
    platform = property(lambda self: self.selection.platform)
    device = property(lambda self: self.selection.device)
    k = property(lambda self: self.selection.k)
    mode = property(lambda self: self.selection.mode)
    precisions = property(lambda self: self.selection.precisions)
    target_precision = property(lambda self: self.selection.target.precision)
    draft_precision = property(lambda self: self.selection.draft.precision if self.selection.draft else None)
    draft_vocab = property(lambda self: self.selection.draft_vocab)
    attention = property(lambda self: self.selection.attention.implementation)

    @property
    def id(self) -> str:
        vocab = f":v{self.draft_vocab}" if self.draft_vocab else ""
        attention = f":attn-{self.attention}" if self.attention else ""
        d = self.selection.decode
        drafting = ((":fused" if d.fused_draft else "") + (f":c{d.confidence_threshold:g}" if d.confidence_threshold else "")
                    + (f":lookup{d.lookup_first}" if d.lookup_first else ""))
        return f"{self.pair}:{self.precisions}:{self.platform}:{self.decoding}:k{self.k}{vocab}{attention}{drafting}"

    @property
    def model_key(self) -> tuple[str, str, str | None, str, int, str]:
        """Combinations with the same key share loaded models."""
        return (self.pair, self.target_precision, self.draft_precision, self.device, self.draft_vocab or 0,
                self.attention or "")

    def as_request(self) -> dict[str, Any]:
        """The fields a worker rebuilds it from (`from_request`; the A/B gate's base arm may be an older
        commit, which builds its own Combination(**fields) from them). The decoding choices a preset
        makes (the fused draft loop, a confidence threshold, a lookup before the draft) travel as
        values, since the worker resolves no preset. Every field added after the first workers is
        written only when set, so that a worker of a commit from before it still reads every
        combination that does not use it (one that does fails to load there, naming the field)."""
        d = self.selection.decode
        fields: dict[str, Any] = {
            "pair": self.pair, "target_precision": self.target_precision, "draft_precision": self.draft_precision,
            "platform": self.platform, "device": self.device, "decoding": self.decoding, "k": self.k,
            "mode": self.mode, "slow": self.slow}
        later = {"draft_vocab": self.draft_vocab, "attention": self.attention, "fused_draft": d.fused_draft or None,
                 "confidence_threshold": d.confidence_threshold or None, "lookup_first": d.lookup_first or None}
        return {**fields, **{name: value for name, value in later.items() if value is not None}}

    @classmethod
    def from_request(cls, matrix: Matrix, fields: dict[str, Any], settings: "PerfSettings") -> "Combination":
        """The combination `as_request` described, resolved again from this arm's registry (a field
        left out or None: the registry's choice)."""
        request = Request(pair=fields["pair"], target_precision=fields.get("target_precision"),
                          draft_precision=fields.get("draft_precision"), ks=(fields["k"],) if fields.get("k") else None,
                          draft_vocab=fields.get("draft_vocab"), attention=fields.get("attention"),
                          fused_draft=fields.get("fused_draft", False),
                          confidence_threshold=fields.get("confidence_threshold", 0.0),
                          lookup_first=fields.get("lookup_first"), platform=fields["platform"],
                          given_by="the perf gate's request")
        return cls(_resolve(matrix, request, fields["decoding"], settings), fields["decoding"],
                   fields.get("slow", False))


def _resolve(matrix: Matrix, request: Request, decoding: str, settings: "PerfSettings") -> Selection:
    """A perf combination's selection: fixed-length runs of the [perf] table's length and sampling."""
    return resolve(matrix, dataclasses.replace(
        request, check_here=False, max_new_tokens=settings.max_new_tokens, fixed_length=True, do_sample=decoding == "sampled",
        temperature=settings.temperature, top_p=settings.top_p))


def combinations(matrix: Matrix, settings: "PerfSettings | None" = None) -> list[Combination]:
    """Every combination of the [perf] table. 'chosen' takes the pair's precisions for this CPU class,
    a preset name (e.g. 'fastest') the pair's preset for this class (its precisions and K; not run
    on a class the preset was not measured on); either is dropped where it repeats another listing."""
    settings = settings or PerfSettings.from_matrix(matrix)
    out: dict[str, Combination] = {}
    chosen: set[str] = set()
    for i, entry in enumerate(matrix.perf["combinations"]):
        pair = matrix.pair(entry["pair"])
        for spec in entry["precisions"]:
            by_class = spec == CHOSEN or spec in pair.presets
            where = f"{matrix.path}: perf.combinations.{i}"
            if spec in pair.presets and matrix.cpu_class not in pair.presets[spec]:
                log.info("perf: pair %s has no %s preset for CPU class %s; that combination is not run",
                         pair.name, spec, matrix.cpu_class)
                continue
            for platform in entry["platforms"]:
                for decoding in entry["decoding"]:
                    combo = of_pair(matrix, pair.name, settings, precisions=spec, decoding=decoding, platform=platform,
                                    attention=entry.get("attention"), slow=entry.get("slow", False), given_by=where)
                    if combo.id in out:
                        if not by_class and combo.id not in chosen:
                            raise RegistryError(f"{matrix.path}: perf.combinations: {combo.id} is listed twice; "
                                                "remove one of them")
                        if not combo.slow:  # the fast listing wins: it runs in `make test`
                            out[combo.id] = combo
                        continue
                    out[combo.id] = combo
                    if by_class:
                        chosen.add(combo.id)
    return list(out.values())


def of_pair(matrix: Matrix, pair: str, settings: "PerfSettings", *, precisions: str = CHOSEN,
            decoding: str = "greedy", platform: str = "cpu", attention: str | None = None, slow: bool = False,
            given_by: str = "a benchmark") -> Combination:
    """One pair as a [perf] line of it resolves (`combinations` builds every line's through this): at
    `precisions` ('chosen': the pair's choice for this CPU class, a preset's name, or 'target+draft',
    checked on load), with the K and drafting choices the CPU class or preset makes. The gate-power
    benchmarks measure the gate through this too, so what they measure is what `make test` gates."""
    spec = matrix.pair(pair)
    if precisions in spec.presets:
        request = Request(pair=spec.name, preset=precisions, given_by=given_by)
    elif precisions == CHOSEN:
        request = Request(pair=spec.name, given_by=given_by)
    else:
        target_p, _, draft_p = precisions.partition("+")
        request = Request(pair=spec.name, target_precision=target_p, draft_precision=draft_p or None,
                          given_by=given_by)
    request = dataclasses.replace(request, platform=platform, attention=attention)
    return Combination(_resolve(matrix, request, decoding, settings), decoding, slow)


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
        return paired.looks(self.rounds, self.batch, self.max_rounds)
