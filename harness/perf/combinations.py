"""The perf gate's combinations: pair x precisions x platform x decoding x K, from matrix.toml's
[perf] table, with an id that reads well:
    qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k6
(with :vN for a restricted draft vocabulary and :attn-NAME for an attention implementation other than
transformers' default) and the gate's settings (rounds, cap, tolerance floor, sampling) from the same table.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from harness.core.errors import RegistryError
from harness.core.registry import CHOSEN, Matrix
from harness.perf.ab import paired

log = logging.getLogger(__name__)


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
    draft_vocab: int | None = None  # the draft scores only its N most frequent tokens (a preset's draft_vocab)
    attention: str | None = None    # target's and draft's attn_implementation (None: transformers' default)

    @property
    def precisions(self) -> str:
        return self.target_precision + (f"+{self.draft_precision}" if self.draft_precision else "")

    @property
    def id(self) -> str:
        vocab = f":v{self.draft_vocab}" if self.draft_vocab else ""
        attention = f":attn-{self.attention}" if self.attention else ""
        return f"{self.pair}:{self.precisions}:{self.platform}:{self.decoding}:k{self.k}{vocab}{attention}"

    @property
    def model_key(self) -> tuple[str, str, str | None, str, int, str]:
        """Combinations with the same key share loaded models."""
        return (self.pair, self.target_precision, self.draft_precision, self.device, self.draft_vocab or 0,
                self.attention or "")

    def as_request(self) -> dict[str, Any]:
        """The fields a worker rebuilds it from; draft_vocab and attention only when set, so that a
        worker of a commit from before them still reads every other combination."""
        fields = dataclasses.asdict(self)
        for optional in ("draft_vocab", "attention"):
            if fields[optional] is None:
                del fields[optional]
        return fields


def combinations(matrix: Matrix) -> list[Combination]:
    """Every combination of the [perf] table. 'chosen' takes the pair's precisions for this CPU class,
    a preset name (e.g. 'fastest') the pair's preset for this class (its precisions and K; not run
    on a class the preset was not measured on); either is dropped where it repeats another listing."""
    out: dict[str, Combination] = {}
    chosen: set[str] = set()
    for entry in matrix.perf["combinations"]:
        pair = matrix.pair(entry["pair"])
        for spec in entry["precisions"]:
            by_class = spec == CHOSEN or spec in pair.presets
            if spec in pair.presets:
                if matrix.cpu_class not in pair.presets[spec]:
                    log.info("perf: pair %s has no %s preset for CPU class %s; that combination is not run",
                             pair.name, spec, matrix.cpu_class)
                    continue
                preset = pair.preset(spec, matrix.cpu_class)
                precisions, k, vocab = preset.precisions, preset.num_assistant_tokens, preset.draft_vocab
            else:
                precisions, k, vocab = (pair.precisions if spec == CHOSEN else spec), pair.num_assistant_tokens, None
            target_p, _, draft_p = precisions.partition("+")
            for platform in entry["platforms"]:
                for decoding in entry["decoding"]:
                    combo = Combination(pair=pair.name, target_precision=target_p, draft_precision=draft_p or None,
                                        platform=platform, device=matrix.platform(platform).device,
                                        decoding=decoding, k=k, mode=pair.mode,
                                        slow=entry.get("slow", False), draft_vocab=vocab,
                                        attention=entry.get("attention"))
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
