"""What to run, resolved once: target and draft with their precisions, K, decoding settings,
attention, draft vocabulary, and where each value came from.

Every caller (bench, the perf combinations and their workers, doctor, HumanEval, the accuracy
tests, benchmarks/) asks `resolve` with a `Request` and reads the frozen `Selection` it returns;
nothing downstream applies a pair, a CPU class's choice or a preset again. A value comes from,
in this order, the first that has it:

    the request (the command line, a perf table entry, a test's parameter)
    the pair's preset (--preset NAME) for this machine's CPU class
    the pair's choice for this machine's CPU class (pairs.NAME.per_cpu_class.CLASS)
    the pair's own registry values
    the registry's [defaults]

A target or draft may be a registry model, a local Hugging Face folder or a hub id (`bench
--target NAME_OR_PATH`): without a pair, precisions, K and prompts come from the request or
[defaults]. Every value's origin is kept (`Selection.origins`), printed by bench and doctor and
written in bench's results JSON.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from harness.core.errors import BadInputError, RegistryError, UnknownNameError, UnsupportedHereError
from harness.machine.platform import device_available
from harness.workload import models
from harness.workload.attention import AttentionChoice
from harness.workload.attention import resolve as resolve_attention
from harness.workload.decode import ASSISTED, PROMPT_LOOKUP, DecodeSettings
from harness.workload.registry import Matrix, ModelSpec, PairSpec, Preset, PromptSetSpec, precisions


class Origin(enum.StrEnum):
    """Where a selected value came from."""

    GIVEN = "given"          # the request: the command line, a perf table entry, a test's parameter
    PRESET = "preset"        # the pair's preset for this CPU class
    CPU_CLASS = "cpu-class"  # the pair's per_cpu_class choice for this CPU class
    PAIR = "pair"            # the pair's own registry values
    DEFAULTS = "defaults"    # the registry's [defaults]


@dataclass(frozen=True)
class Request:
    """What a caller asks for; None means 'not given' (the registry decides)."""

    pair: str | None = None
    target: str | None = None       # a registry model, a local folder or a hub id: replaces the pair's target
    draft: str | None = None        # likewise for the draft
    preset: str | None = None
    target_precision: str | None = None
    draft_precision: str | None = None
    ks: tuple[int, ...] | None = None  # several: bench's K sweep (plain runs shared)
    prompt_lookup: int | None = None   # prompt-lookup decoding with N candidate tokens instead of a draft
    lookup_first: int | None = None    # a prompt lookup before the draft, on a matching context end of N tokens
    fused_draft: bool | None = None    # the draft in its fused decode loop (harness/workload/fused_draft.py);
    #                                    None: as the preset or the CPU class's choice says (greedy runs only)
    reference_precision: str | None = None
    draft_vocab: int | None = None
    attention: str | None = None
    fast_attention: bool = False
    platform: str | None = None
    task: str | None = None
    prompt_set: str | None = None   # a registry prompt set instead of the task's
    max_new_tokens: int | None = None
    fixed_length: bool | None = None  # exactly max_new_tokens new tokens (default: task 'benchmark')
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    schedule: str | None = None
    confidence_threshold: float | None = None
    check_here: bool = True  # fail now on what this machine cannot run (a device, a CPU kernel); the perf
    #                          table lists combinations for every machine and marks those skips itself
    given_by: str = "the command line"  # how errors and origins name the request's values
    option_names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # field -> option, for errors


OPTION = {"target_precision": "--target-precision", "draft_precision": "--draft-precision",
          "reference_precision": "--reference-precision", "ks": "--num-assistant-tokens",
          "draft_vocab": "--draft-vocab", "preset": "--preset", "pair": "--pair", "target": "--target",
          "draft": "--draft", "prompt_lookup": "--prompt-lookup", "lookup_first": "--lookup-first",
          "fused_draft": "--fused-draft", "do_sample": "--do-sample", "schedule": "--schedule",
          "confidence_threshold": "--confidence-threshold", "attention": "--attention",
          "platform": "--platform", "task": "--task"}


@dataclass(frozen=True)
class ModelChoice:
    """One model of the run and how it is loaded."""

    spec: ModelSpec
    precision: str
    draft_vocab: int | None = None  # the draft scores only its N most frequent tokens (harness/workload/drafthead.py)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Selection:
    """One resolved run. K lives here (`ks`) and nowhere else: a generate call is given its K."""

    pair: str                      # the registry pair, or 'TARGET+DRAFT' for models given without one
    target: ModelChoice
    draft: ModelChoice | None
    ks: tuple[int, ...]            # draft tokens per step; several only for bench's sweep
    decode: DecodeSettings
    reference_precision: str | None  # a second plain arm at this precision (None: none)
    attention: AttentionChoice
    platform: str
    device: str
    task: str
    prompt_set: PromptSetSpec
    cpu_class: str
    preset: Preset | None
    origins: Mapping[str, str] = dataclasses.field(compare=False, hash=False)  # value -> its Origin (and which)
    reasons: tuple[str, ...] = ()  # why the registry chose what it chose (the preset's or class's 'why')

    @property
    def k(self) -> int:
        return self.ks[0]

    @property
    def mode(self) -> str:
        """The assisted arm: assisted (a draft model) or prompt-lookup (none)."""
        return ASSISTED if self.draft else PROMPT_LOOKUP

    @property
    def precisions(self) -> str:
        """'target+draft' (or the target's alone): for ids and file names only."""
        return self.target.precision + (f"+{self.draft.precision}" if self.draft else "")

    @property
    def draft_vocab(self) -> int | None:
        return self.draft.draft_vocab if self.draft else None

    def origin(self, name: str) -> str:
        return self.origins.get(name, Origin.DEFAULTS)

    def headline(self, *, names: bool = True) -> str:
        """'target [NAME] P (origin), draft [NAME] P (origin), K=k (origin)': what runs and from where."""
        def model(role: str, m: ModelChoice) -> str:
            return f"{role} {m.name + ' ' if names else ''}{m.precision} ({self.origin(role + '_precision')})"

        draft = f", {model('draft', self.draft)}" if self.draft else ", prompt lookup"
        lookup = (f", prompt lookup first on {self.decode.lookup_first} matching tokens ({self.origin('lookup_first')})"
                  if self.decode.lookup_first else "")
        lookup += f", fused draft loop ({self.origin('fused_draft')})" if self.decode.fused_draft else ""
        c = self.decode.confidence_threshold
        lookup += f", a step ends below confidence {c:g} ({self.origin('confidence_threshold')})" if c else ""
        return f"{model('target', self.target)}{draft}, K={','.join(map(str, self.ks))} ({self.origin('k')}){lookup}"

    def as_values(self) -> dict[str, Any]:
        return {"target": self.target.name, "target_precision": self.target.precision,
                "draft": self.draft.name if self.draft else None,
                "draft_precision": self.draft.precision if self.draft else None,
                "k": list(self.ks), "draft_vocab": self.draft_vocab, "reference_precision": self.reference_precision,
                "attention": self.attention.implementation, "schedule": self.decode.schedule,
                "confidence_threshold": self.decode.confidence_threshold, "lookup_first": self.decode.lookup_first,
                "fused_draft": self.decode.fused_draft, "max_new_tokens": self.decode.max_new_tokens, "task": self.task, "prompt_set": self.prompt_set.name}

    def as_dict(self) -> dict[str, Any]:
        """The results files' record: each value and where it came from."""
        return {"pair": self.pair, "mode": self.mode, "cpu_class": self.cpu_class,
                "preset": self.preset.name if self.preset else None,
                "values": self.as_values(), "origins": dict(self.origins), "reasons": list(self.reasons)}


class _Sources:
    """The layers one value may come from, first that has it wins, and the origin of each value taken."""

    def __init__(self, matrix: Matrix, pair: PairSpec | None, preset: Preset | None, *, on_cpu: bool = True) -> None:
        cls = matrix.cpu_class
        # the class's choice was measured on this CPU's kernels: a run on another device does without it
        chosen = pair.per_cpu_class.get(cls) if (pair and on_cpu) else None
        self.pair, self.preset, self.chosen, self.cls, self.on_cpu = pair, preset, chosen, cls, on_cpu
        self.layers = [(preset, f"{Origin.PRESET} {preset.name}" if preset else ""),
                       (chosen, f"{Origin.CPU_CLASS} {cls}"),
                       (pair, f"{Origin.PAIR} {pair.name}" if pair else ""),
                       (matrix.defaults, Origin.DEFAULTS.value)]
        self.origins: dict[str, str] = {}

    def given(self, name: str, value: Any) -> Any:
        """A value only the request (or nothing) gives."""
        return self.pick(name, (value, Origin.GIVEN.value))

    def pick(self, name: str, *candidates: tuple[Any, str]) -> Any:
        for value, origin in candidates:
            if value is not None:
                self.origins[name] = origin
                return value
        return None

    def layered(self, name: str, given: Any, field: str | None = None, *, only: tuple[str, ...] = ()) -> Any:
        """The request's value, else the preset's, the class's choice, the pair's, the defaults'
        (`only`: just these layers, by origin prefix)."""
        field = field or name
        layers = [(getattr(obj, field, None) if obj is not None else None, origin) for obj, origin in self.layers
                  if not only or origin.startswith(only)]
        return self.pick(name, (given, Origin.GIVEN.value), *layers)

    def reasons(self) -> tuple[str, ...]:
        pair, preset, chosen, cls = self.pair, self.preset, self.chosen, self.cls
        out = []
        if preset and pair:
            out.append(f"preset {preset.name} for CPU class {preset.cpu_class} "
                       f"({pair.name}.presets.{preset.name}.{cls}): {preset.why}")
        if chosen and pair:
            out.append(f"CPU class {cls} choice ({pair.name}.per_cpu_class.{cls}): {chosen.why}")
        elif pair and pair.per_cpu_class and not self.on_cpu:
            out.append(f"not on the CPU: the pair's own settings ({pair.name}.per_cpu_class is measured on CPU kernels)")
        elif pair and pair.per_cpu_class:
            out.append(f"no {cls} entry for {pair.name} (has: {', '.join(pair.per_cpu_class)}): the pair's own "
                       "settings, not measured on this class")
        return tuple(out)


def resolve(matrix: Matrix, request: Request = Request()) -> Selection:
    """The one place a pair, the CPU class's choice, a preset and the request are combined.

    Bad input (a preset, precision, K or attention the pair cannot take) is one line naming the
    option, the value and what is allowed."""
    r = request
    opt = {**OPTION, **r.option_names}
    _check_request(matrix, r, opt)
    # a target given without a pair runs without one; otherwise the pair asked for or the default pair,
    # with a given target or draft in place of its own
    pair = None if (r.target and not r.pair) else matrix.pair(r.pair or matrix.defaults.pair)
    if r.preset and pair is None:
        raise BadInputError(f"{opt['preset']} {r.preset}: presets belong to a pair; give {opt['pair']} "
                            "(python -m harness pairs lists them)")
    platform_name = r.platform or "cpu"
    device = matrix.platform(platform_name).device
    src = _Sources(matrix, pair, pair.preset(r.preset, matrix.cpu_class) if (pair and r.preset) else None,
                   on_cpu=device == "cpu")
    target, draft = _models(matrix, r, pair, src, opt)
    if r.lookup_first is not None and draft is None:
        raise BadInputError(f"{opt['lookup_first']} {r.lookup_first}: a lookup before the draft needs a draft model; "
                           f"this run has none ({opt['prompt_lookup'] if r.prompt_lookup is not None else 'its pair has none'}"
                           f"): drop {opt['lookup_first']}")
    if r.prompt_lookup is not None:
        ks = src.given("k", (r.prompt_lookup,))
    elif r.ks:
        ks = src.given("k", tuple(r.ks))
    else:
        k = src.layered("k", None, "num_assistant_tokens")
        ks = (k,) if k is not None else None
    if ks is None:
        raise RegistryError(f"{matrix.path}: no num_assistant_tokens for {target.name} without a pair: give "
                            f"{opt['ks']} or add defaults.num_assistant_tokens to the registry")
    if r.check_here and (reason := device_available(device)):
        raise UnsupportedHereError(f"{opt['platform']} {platform_name}: {reason}")
    attention = resolve_attention(r.attention, fast=r.fast_attention, device=device)
    if r.attention or r.fast_attention:
        src.origins["attention"] = Origin.GIVEN.value
    reference = src.layered("reference_precision", r.reference_precision, only=(Origin.PRESET,))
    if device == "cpu" and r.check_here:
        _check_kernels(src, opt, target, draft, reference)
    task = src.pick("task", (r.task, Origin.GIVEN.value), (matrix.defaults.task, Origin.DEFAULTS.value))
    prompt_set = _prompt_set(matrix, r, task, pair, src)
    name = pair.name if pair and not (r.target or r.draft) else _pair_name(matrix, target.spec,
                                                                             draft.spec if draft else None)
    decode = _decode(matrix, r, task, prompt_set, src)
    if decode.fused_draft and (problem := _fused_draft_problem(decode, draft, opt)):
        if src.origins.get("fused_draft") == Origin.GIVEN.value:
            raise BadInputError(problem)
        # the registry chose it for greedy runs with a constant K: this run drafts through transformers
        decode = dataclasses.replace(decode, fused_draft=False)
        src.origins.pop("fused_draft")
    return Selection(
        pair=name, target=target, draft=draft, ks=tuple(ks),
        decode=decode, reference_precision=reference, attention=attention,
        platform=platform_name, device=device, task=task, prompt_set=prompt_set, cpu_class=matrix.cpu_class,
        preset=src.preset, origins=MappingProxyType(dict(src.origins)), reasons=src.reasons())


def _models(matrix: Matrix, r: Request, pair: PairSpec | None, src: _Sources,
            opt: Mapping[str, str]) -> tuple[ModelChoice, ModelChoice | None]:
    """The target and the draft (None: prompt lookup) with their precisions and the draft's vocabulary."""
    given = Origin.GIVEN.value
    target_spec = _model(matrix, r.target, opt["target"]) if r.target else matrix.model(pair.target)
    src.origins["target"] = given if r.target else f"{Origin.PAIR} {pair.name}"
    lookup = r.prompt_lookup is not None or (pair is not None and pair.mode == PROMPT_LOOKUP and not r.draft)
    draft_spec = None
    if not lookup and r.draft:
        draft_spec, src.origins["draft"] = _model(matrix, r.draft, opt["draft"]), given
    elif not lookup and pair is not None and pair.draft:
        draft_spec, src.origins["draft"] = matrix.model(pair.draft), f"{Origin.PAIR} {pair.name}"
    target_precision = src.layered("target_precision", r.target_precision)
    _require(matrix, target_precision, "target_precision", target_spec, opt)
    if draft_spec is None:  # a target alone, or prompt lookup: plain against prompt lookup
        for name in ("draft_precision", "draft_vocab"):
            if getattr(r, name) is not None:
                raise BadInputError(f"{opt[name]} {getattr(r, name)}: this run has no draft model "
                                   f"({'--prompt-lookup' if r.prompt_lookup is not None else 'its pair has none'})")
        return ModelChoice(target_spec, target_precision), None
    draft_precision = src.layered("draft_precision", r.draft_precision)
    _require(matrix, draft_precision, "draft_precision", target_spec, opt)
    draft_vocab = src.layered("draft_vocab", r.draft_vocab, only=(Origin.PRESET,))
    return ModelChoice(target_spec, target_precision), ModelChoice(draft_spec, draft_precision, draft_vocab)


def _require(matrix: Matrix, value: Any, name: str, target: ModelSpec, opt: Mapping[str, str]) -> None:
    if value is None:
        raise RegistryError(f"{matrix.path}: no {name} for {target.name} without a pair: give {opt[name]} or add "
                            f"defaults.{name} to the registry")


def _check_kernels(src: _Sources, opt: Mapping[str, str], target: ModelChoice, draft: ModelChoice | None,
                   reference: str | None) -> None:
    """Every precision the run needs has a kernel that runs on this CPU, checked before any model loads."""
    for name, precision in (("target_precision", target.precision),
                            ("draft_precision", draft.precision if draft else None),
                            ("reference_precision", reference)):
        if precision is not None:
            models.require_kernel(precision, named_by=opt[name], via=_via(src.origins.get(name, "")))


def _decode(matrix: Matrix, r: Request, task: str, prompt_set: PromptSetSpec, src: _Sources) -> DecodeSettings:
    max_new = src.pick("max_new_tokens", (r.max_new_tokens, Origin.GIVEN.value),
                       (matrix.defaults.max_new_tokens, Origin.DEFAULTS.value))
    fixed = task == "benchmark" if r.fixed_length is None else r.fixed_length
    return DecodeSettings(
        max_new_tokens=max_new, min_new_tokens=max_new if fixed else 0, do_sample=r.do_sample,
        temperature=(1.0 if r.temperature is None else r.temperature) if r.do_sample else 1.0,
        top_p=(1.0 if r.top_p is None else r.top_p) if r.do_sample else 1.0, seed=r.seed,
        schedule=src.layered("schedule", r.schedule),
        confidence_threshold=src.layered("confidence_threshold", r.confidence_threshold),
        prompt_lookup_ngram=matrix.defaults.prompt_lookup_ngram,
        lookup_first=src.given("lookup_first", r.lookup_first) or 0,
        fused_draft=_fused_draft(r, src), stop_sequences=prompt_set.stop_sequences)


def _check_request(matrix: Matrix, r: Request, opt: Mapping[str, str]) -> None:
    """What no registry value can make right: an unknown precision, a K below 1, two kinds of drafting."""
    known = precisions()
    for name in ("target_precision", "draft_precision", "reference_precision"):
        value = getattr(r, name)
        if value is not None and value not in known:
            raise UnknownNameError(f"{opt[name]} precision", value, known, where=f"{r.given_by}")
    if r.ks is not None and (not r.ks or min(r.ks) < 1):
        raise BadInputError(f"{opt['ks']} {','.join(map(str, r.ks))}: K is the number of drafted tokens per "
                           "step, 1 or more")
    if r.lookup_first is not None and not 1 <= r.lookup_first <= matrix.defaults.prompt_lookup_ngram:
        raise BadInputError(f"{opt['lookup_first']} {r.lookup_first}: the matching context end is 1 to "
                           f"{matrix.defaults.prompt_lookup_ngram} tokens (defaults.prompt_lookup_ngram in {matrix.path})")
    if r.prompt_lookup is not None and (r.draft or r.ks):
        raise BadInputError(f"{opt['prompt_lookup']} {r.prompt_lookup}: prompt lookup replaces the draft; "
                           f"drop {opt['draft'] if r.draft else opt['ks']}")


def _fused_draft(r: Request, src: _Sources) -> bool:
    """Given, else the preset's or the CPU class's choice (resolve drops a choice the run cannot use)."""
    if r.fused_draft is not None:
        return bool(src.given("fused_draft", r.fused_draft))
    return bool(src.layered("fused_draft", None, only=(Origin.PRESET, Origin.CPU_CLASS)))


def _fused_draft_problem(decode: DecodeSettings, draft: ModelChoice | None, opt: Mapping[str, str]) -> str | None:
    """Why the fused draft loop cannot serve this run (it drafts greedily, up to a constant K, with a draft
    model: harness/workload/fused_draft.py), or None."""
    flag = opt["fused_draft"]
    if draft is None:
        return f"{flag}: the fused loop runs a draft model; this run has none (prompt lookup): drop {flag}"
    if decode.do_sample:
        return f"{flag}: the fused draft loop drafts greedily; drop {opt['do_sample']} or {flag}"
    if decode.schedule != "constant":
        return (f"{flag}: the fused draft loop drafts up to a constant K tokens a step; drop "
                f"{opt['schedule']} {decode.schedule} or {flag}")
    return None


def _via(origin: str) -> str:
    return f" (from the {origin})" if origin.startswith(Origin.PRESET) else ""


def _model(matrix: Matrix, name: str, option: str) -> ModelSpec:
    try:
        return models.resolve_spec(matrix, name)
    except UnknownNameError as exc:
        raise UnknownNameError(f"{option} model", name, exc.available,
                               where=f"{matrix.path}; or give a Hugging Face model folder") from None


def _prompt_set(matrix: Matrix, r: Request, task: str, pair: PairSpec | None, layers: _Sources) -> PromptSetSpec:
    if r.prompt_set:
        layers.origins["prompt_set"] = Origin.GIVEN.value
        return matrix.prompt_set(r.prompt_set)
    set_name = matrix.task_prompt_set(task)
    if set_name != "pair":
        layers.origins["prompt_set"] = f"task {task}"
        return matrix.prompt_set(set_name)
    if pair is not None:
        layers.origins["prompt_set"] = f"{Origin.PAIR} {pair.name}"
        return matrix.prompt_set(pair.prompt_set)
    if matrix.defaults.prompt_set is None:
        raise RegistryError(f"{matrix.path}: task {task} runs the pair's prompt set, and models given without "
                            "a pair have none: give --task benchmark_code, or add defaults.prompt_set")
    layers.origins["prompt_set"] = Origin.DEFAULTS.value
    return matrix.prompt_set(matrix.defaults.prompt_set)


def _pair_name(matrix: Matrix, target: ModelSpec, draft: ModelSpec | None) -> str:
    """'TARGET+DRAFT' (or 'TARGET+lookup'): registry names, a folder's name, a hub id's last part."""
    def short(spec: ModelSpec) -> str:
        if spec.name in matrix.models:
            return spec.name
        return spec.path.name if spec.path is not None else spec.name.rsplit("/", 1)[-1]

    return short(target) + (f"+{short(draft)}" if draft else "+lookup")
