"""The result record: one home for what a measured generation holds and how the table shows it.

`Measurement` holds the numbers every generation has (the reference's columns). A
`GenerationResult` is one `generate` call (harness/measure/generate.py fills it); a `Row` is one
prompt under one configuration, medians over repeats (harness/measure/bench.py fills it); a
`Summary` is one configuration over all prompts. Each field that is a table column says so in its
metadata, so `COLUMNS` is derived from the dataclasses, and tests/unit/test_record.py holds the
results JSON schema (harness/schemas/bench-results.schema.json) to these same fields.

Metric definitions:
  prompt_tokens      tokens of the encoded prompt
  new_tokens         tokens generated
  total_s            wall time of the whole `generate` call (tokenization excluded)
  prefill_ms         from the call to the end of the target's first forward pass, i.e. the moment
                     the first new token exists. Assisted: includes the draft's prefill and its first
                     K draft tokens, and the target's prefill fused with the first verification.
  time_per_token_ms  (total - prefill) / (new tokens produced after the first target pass).
                     Plain decoding produces 1 token in that pass, giving (total - prefill) /
                     (new - 1); an assisted first pass can produce up to K+1 tokens, and counting
                     them as decode tokens would flatter assisted decoding.
  tokens_per_sec     1000 / time_per_token_ms
  cpu_s              process CPU time of the call (both cores busy: up to 2x total_s)
  target_forwards    forward passes of the target model (a forward hook counts them)
  drafted            candidate tokens proposed (sum over verification steps)
  accepted           candidate tokens the target kept (sum of transformers' n_matches)
  mean_accepted_length  new tokens per verification step (accepted + the target's own token)
  speedup            plain time_per_token_ms / assisted time_per_token_ms on the same prompt,
                     pairing the r-th plain run with the r-th assisted run (same interleave slot)
  speedup_vs_reference  the same against the plain arm at --reference-precision (e.g. plain bf16
                     beside an int8 target's own plain arm)
  phases             each forward pass of the target and the draft timed and filed by phase
                     (prefill, draft_prefill, target_step, verify, draft_step) with the decode
                     phase's host overhead, and each in the thread's CPU time too (overhead_cpu,
                     target_step_cpu, ...): calls, total, median and 10th-percentile ms
                     (harness/measure/phases.py; CPU only, null on a GPU)
  accounting         a configuration's decode phase: sum(calls x median) of its passes beside the
                     measured wall time, and the overhead outside the passes
  acceptance_by_position  for drafted position i, the share of steps drafting it whose target kept it
                     (the draft model's steps; --lookup-first's lookup steps are not among them)
  lookup_per_step    --lookup-first: per verification step, whether a prompt lookup proposed its
                     candidates instead of the draft (harness/workload/lookup_first.py)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.measure.phases import Accounting, PhaseCost


_REQUIRED: Any = object()


def column(order: int, header: str, spec: str = "", suffix: str = "", over: str | None = None,
           default: Any = _REQUIRED) -> Any:
    """A field that is a table column: its position, header and format; `over` shows 'other/this'
    (Accepted/Drafted)."""
    metadata = {"column": {"order": order, "header": header, "spec": spec, "suffix": suffix, "over": over}}
    return field(metadata=metadata) if default is _REQUIRED else field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class Measurement:
    """What one generation measured: the reference's columns, then the suite's counters."""

    prompt_tokens: int = column(2, "Prompt Length (tokens)")
    new_tokens: int = column(3, "New Tokens Generated")
    total_s: float = column(4, "Total Time (s)", ".2f")
    prefill_ms: float = column(5, "Prefill Phase (ms)", ".1f")
    time_per_token_ms: float | None = column(6, "Time/Token (ms)", ".1f")
    tokens_per_sec: float | None = column(7, "Tokens/Sec", ".2f")
    cpu_s: float
    target_forwards: int = column(10, "Target Forwards")
    drafted: int | None = column(8, "Accepted/Drafted", over="accepted", default=None)
    accepted: int | None = None
    mean_accepted_length: float | None = column(9, "Mean Accepted Length", ".2f", default=None)


@dataclass(kw_only=True)
class GenerationResult(Measurement):
    """One `generate` call: the measurement, the tokens and the per-step counters."""

    mode: str  # plain | assisted | prompt-lookup
    accepted_per_step: list[int] | None = None
    drafted_per_step: list[int] | None = None
    lookup_per_step: list[bool] | None = None  # --lookup-first: the steps whose candidates a prompt lookup proposed
    tokens: list[int] = field(default_factory=list)
    phases: dict[str, PhaseCost] | None = None  # phase -> its passes' costs (CPU only: harness/measure/phases.py)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sample(self) -> dict[str, Any]:
        """This call as one of a Row's samples (the row already says the mode)."""
        return {k: v for k, v in self.as_dict().items() if k != "mode"}

    @classmethod
    def from_sample(cls, mode: str, doc: dict[str, Any]) -> "GenerationResult":
        """A call back from one of a Row's samples."""
        phases = doc.get("phases")
        return cls(mode=mode, **{**doc, "phases": None if phases is None else
                                 {name: PhaseCost.from_dict(cost) for name, cost in phases.items()}})

    def draft_steps(self) -> tuple[list[int], list[int]]:
        """(drafted, accepted) of each step whose candidates the draft model proposed (a
        --lookup-first step is left out): what the acceptance by drafted position is made of."""
        drafted, accepted = self.drafted_per_step or [], self.accepted_per_step or []
        looked_up = self.lookup_per_step or [False] * len(drafted)
        keep = [i for i, lookup in enumerate(looked_up) if not lookup]
        return [drafted[i] for i in keep], [accepted[i] for i in keep]

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after the target's first forward pass (the decode phase)."""
        first = self.accepted_per_step[0] + 1 if self.accepted_per_step else 1
        return self.new_tokens - first

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_ms / 1000.0


@dataclass(kw_only=True)
class Row(Measurement):
    """One prompt under one configuration: medians over the repeats, one line of the table."""

    example: int = column(1, "Example#")
    prompt_id: str
    configuration: str
    mode: str
    k: int | None
    speedup: float | None = column(11, "Speedup", ".2f", "x")
    speedup_vs_reference: float | None = column(12, "vs Reference", ".2f", "x", default=None)
    same_tokens_as_plain: bool | None
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Summary:
    """One configuration over all prompts."""

    configuration: str
    mode: str
    k: int | None
    prompts: int
    median_tokens_per_sec: float | None
    median_time_per_token_ms: float | None
    median_speedup: float | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    prompts_same_tokens_as_plain: int | None
    median_speedup_vs_reference: float | None = None  # over the plain arm at --reference-precision
    phases: dict[str, PhaseCost] | None = None         # every run's phases pooled (harness/measure/phases.py)
    accounting: Accounting | None = None               # the decode phase: its passes beside its wall time
    acceptance_by_position: list[float] | None = None  # drafted position i -> share of steps keeping it


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    spec: str = ""
    suffix: str = ""
    over: str | None = None

    def cell(self, row: Row) -> str:
        value = getattr(row, self.key)
        if value is None:
            return "-"
        if self.over is not None:
            return f"{getattr(row, self.over)}/{value}"
        return f"{value:{self.spec}}{self.suffix}"


def _columns() -> list[Column]:
    found = [(f.metadata["column"], f.name) for f in fields(Row) if "column" in f.metadata]
    return [Column(c["header"], name, c["spec"], c["suffix"], c["over"])
            for c, name in sorted(found, key=lambda item: item[0]["order"])]


COLUMNS: list[Column] = _columns()  # the reference's columns in order, then the suite's own
