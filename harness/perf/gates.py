"""How a combination runs through a gate, for the pytest plugin (harness/perf/plugin.py): the
session's state (loaded models, baselines, staged updates, results), the stored-baseline gate with
its host check, the A/B gate, and the --perf-update-baselines staging. Each test ends in pytest.fail /
pytest.skip with the gate's message, or returns on a pass."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
import warnings
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

import harness
from harness.core import locks
from harness.machine import hostspeed, platform
from harness.workload import models, registry
from harness.core.errors import HarnessError
from harness.workload.decode import ASSISTED
from harness.perf import replay
from harness.perf.ab import duet, environment, reference, revision
from harness.perf.ab.arms import Arm
from harness.perf.ab.environment import Environment
from harness.perf.ab.loadguard import LoadGuard
from harness.perf.ab.gate import ABGate, ABResult, ABSettings
from harness.perf.combinations import Combination, PerfSettings
from harness.perf.outcome import Outcome
from harness.perf.record import METRICS, ABDetail, CombinationResult, acceptance_rate
from harness.machine.provenance import software_versions
from harness.perf.plant import ASSISTED_ONLY
from harness.perf.runner import LoadedPair, Runner, git_commit, load_pair
from harness.perf.stored import baselines, host, placement
from harness.perf.stored.verdict import (BaselineMismatchError, Verdict, check_comparable, check_placement, confirm,
                                         evaluate)

log = logging.getLogger(__name__)


class PerfUndecidedWarning(UserWarning):
    """The perf gate could not decide within its sample cap (see --perf-undecided)."""


def ab_trees(session: "PerfSession", rev: str | None) -> tuple[revision.Tree, revision.Tree]:
    """(base, candidate) of the A/B gate: REV (or the reference commit) checked out, and the working tree;
    without REV (another environment is the change) the working tree is both. The session first takes
    the repository's A/B gate lock, and holds it to its end: a second gate on this machine waits
    (saying for which process) instead of measuring beside this one."""
    repo = revision.repository_root(Path(harness.__file__).parent)
    session.hold(revision.gate_lock(repo), "A/B gate", guards=repo)
    candidate = revision.working_tree(repo)
    if rev is None:
        return candidate, candidate
    sha = reference.read().commit if rev == reference.NAME else rev
    return revision.checkout(repo, sha, label=rev), candidate


def ab_environments(session: "PerfSession") -> tuple[Environment, Environment]:
    """(base, candidate) Python environments of the A/B gate: the candidate in this one, the base in
    --perf-base-python's interpreter or --perf-base-env's overlay (built here once, saying each step)."""
    opt = session.config.getoption
    here = environment.current()
    if opt("perf_base_python"):
        return environment.from_python(opt("perf_base_python")), here
    if opt("perf_base_env"):
        return environment.build(opt("perf_base_env"), here, say=session.say), here
    return here, here


class PerfSession:
    """Session state: the loaded models (one pair at a time), baselines, staged updates, results."""

    def __init__(self, config: pytest.Config, matrix: registry.Matrix, combos: list[Combination]):
        self.config, self.matrix, self.combinations = config, matrix, combos
        self.settings = PerfSettings.from_matrix(
            matrix, rounds=config.getoption("perf_repeats"), max_rounds=config.getoption("perf_max_repeats"),
            tolerance_override=config.getoption("perf_tolerance"))
        if self.settings.max_rounds < self.settings.rounds:
            self.settings = PerfSettings(**{**self.settings.__dict__, "max_rounds": self.settings.rounds})
        self.directory = Path(config.getoption("perf_baselines_dir"))
        self.updating = config.getoption("perf_update_baselines")
        self.loaded: LoadedPair | None = None
        self.staged: dict[str, dict[str, Any]] = {}
        self.results: list[CombinationResult] = []
        self._baseline_docs: dict[str, dict[str, Any] | None] = {}  # device -> that platform's file, read once
        self.update_lines: list[str] = []
        self.trees: tuple[revision.Tree, revision.Tree] | None = None  # --perf-against: (base, candidate)
        # the A/B arms' Python environments (base, candidate): this one for both unless --perf-base-python or
        # --perf-base-env names the base's (harness/perf/ab/environment.py), resolved at configure or first use
        self.environments: tuple[Environment, Environment] | None = None
        self.reference_trees: tuple[revision.Tree, revision.Tree] | None = None  # no stored baseline here
        self.gated = 0  # perf tests selected to run (the A/B gate's family of tests)
        self.nodeids: dict[str, str] = {}  # combination id -> its test's node id (--benchmark-json names them)
        self.notes: list[str] = []  # lines for the end of the run: software changes, host checks (once each)
        self.probe: dict[str, Any] | None = None  # this host's speed probe, measured once when first needed
        self.plan: duet.Plan = duet.IN_TURN  # the A/B gate's arms side by side or in turn: --perf-duet, set at configure
        self.noise: tuple[int, ...] = ()  # a deliberate noisy neighbour's pids (HARNESS_NOISY_HOST), set at configure
        self.recording: replay.Recording | None = None  # --perf-replay: rounds to decide from instead of measuring
        self.placement = placement.EVERY_CORE  # the stored gate's threads: --perf-threads, set at configure
        self.history: str | Path | None = None  # --perf-history or $HARNESS_HISTORY, checked at configure
        self.held = contextlib.ExitStack()  # locks held to the end of the session (closed at sessionfinish)
        self._held_paths: set[Path] = set()

    def hold(self, path: Path, what: str, guards: Path | None = None) -> None:
        """Take the lock at `path` (once) until the session ends; a wait is said on the terminal."""
        if path not in self._held_paths:
            self.held.enter_context(locks.held(path, what=what, on_wait=self.say, guards=guards))
            self._held_paths.add(path)

    def say(self, line: str) -> None:
        """One line on the terminal now, outside any test's captured output."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if terminal is None:
            log.warning("%s", line)
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            terminal.ensure_newline()
            terminal.write_line(line)

    # models: one pair in memory at a time (24 GiB here)
    def models_for(self, combo: Combination) -> LoadedPair:
        if combo.device == "cpu":
            # before the first model loads, in update and check alike: in a process that holds GBs
            # of models the memory rate came out 35% above a fresh process's on the same host
            self.host_probe()
        if self.loaded is None or self.loaded.key != combo.model_key:
            self.loaded = None
            gc.collect()
            self.loaded = load_pair(combo, slowdown=self.config.getoption("perf_plant_slowdown"),
                                    plant_into=self.config.getoption("perf_plant_into"))
        return self.loaded

    def counts(self, skipped: int = 0) -> dict[str, int]:
        outcomes = [r.verdict for r in self.results]
        gated = [o for o in outcomes if o.gated]
        return {"gated": len(gated), "regressed": gated.count(Outcome.REGRESSION),
                "undecided": gated.count(Outcome.UNDECIDED), "skipped": skipped,
                "deferred": outcomes.count(Outcome.DEFERRED)}

    def note(self, *lines: str) -> None:
        self.notes += [line for line in lines if line not in self.notes]

    def placement_for(self, device: str) -> placement.Placement:
        """Where a combination on `device` measures: --perf-threads on the CPU; a GPU's rounds are
        the GPU's, and its host thread is left as it is (recorded as `all`)."""
        return self.placement if device == "cpu" else placement.EVERY_CORE

    def host_probe(self) -> dict[str, Any]:
        if self.probe is None:
            with self.placement_for("cpu").applied():  # as the rounds it vouches for are measured
                self.probe = hostspeed.measure()
            log.info("host-speed probe: %s (%.1f s)", self.probe["rates"], self.probe["seconds"])
        return self.probe

    def platform_id(self, device: str) -> str:
        return platform.detect(device).id

    def baseline_path(self, device: str) -> Path:
        return baselines.path_for(self.directory, self.platform_id(device))

    def baseline_doc(self, device: str) -> dict[str, Any] | None:
        """The baseline file of `device`'s platform (each device has its own platform id and file)."""
        if device not in self._baseline_docs:
            self._baseline_docs[device] = baselines.load(self.baseline_path(device), platform_id=self.platform_id(device),
                                                         cpu_class=platform.detect(device).capability)
        return self._baseline_docs[device]


def run_gate(session: PerfSession, combo: Combination, request: pytest.FixtureRequest) -> None:
    """Measure one combination and apply the gates (or stage its new baseline). The stored-baseline
    gate times its rounds through pytest-benchmark's fixture; the A/B gate's rounds run in workers."""
    into = session.config.getoption("perf_plant_into")
    if session.config.getoption("perf_plant_slowdown") and into in ASSISTED_ONLY and combo.mode != ASSISTED:
        pytest.skip(f"{combo.id}: --perf-plant-into {into}: this combination has no draft model ({combo.mode})")
    if session.recording is not None:
        return replay_gate(session, combo, request)
    if session.trees is not None:
        return run_ab_gate(session, combo, session.trees)
    baseline = _baseline_or_skip(session, combo)
    if baseline is None and not session.updating:  # no stored baseline here: A/B against the reference
        log.warning("%s: no stored baseline on this platform; gating A/B against the reference commit", combo.id)
        try:
            session.reference_trees = session.reference_trees or ab_trees(session, reference.NAME)
        except HarnessError as exc:
            pytest.fail(f"{combo.id}: no stored baseline, and the A/B gate against the reference cannot run: {exc}",
                        pytrace=False)
        return run_ab_gate(session, combo, session.reference_trees, note="no stored baseline on this platform: gated A/B against the "
                                                "reference commit (baselines/reference.json)")
    if baseline is not None and not session.updating:
        _refuse_other_work(session, combo, lambda: check_placement(combo.id, session.placement_for(combo.device).threads,
                                                                   baseline))
    checked = None if baseline is None or session.updating else _host_check(session, combo, baseline)
    if checked is not None and checked.deferred:
        return _defer(session, combo, checked)
    benchmark = request.getfixturevalue("benchmark")
    runner = Runner(combo, session.models_for(combo), session.settings)
    if checked is not None:  # a stored baseline to compare with
        _refuse_other_work(session, combo, lambda: check_comparable(runner, baseline))
    verdict = None
    where = session.placement_for(combo.device)
    session.note(where.reason)
    with where.applied():
        _measure(session, runner, benchmark)
        if session.updating:
            result = _stage(session, runner)
        else:
            verdict, result = _stored_verdict(session, runner, baseline, checked)
    session.results.append(result)
    if benchmark is not None:
        benchmark.extra_info.update({"combination": combo.id, "verdict": result.verdict.value,
                                     "acceptance_rate": result.acceptance_rate,
                                     **{f"{m}_samples": result.metric(m) for m in METRICS}})
    if verdict is not None:
        _report(session, combo, verdict)


def run_ab_gate(session: PerfSession, combo: Combination, trees: tuple[revision.Tree, revision.Tree],
                note: str | None = None) -> None:
    """The A/B gate: the working tree against a base revision, in one job (harness/perf/ab/gate.py)."""
    base, candidate = trees
    opt = session.config.getoption
    plant = {"fraction": opt("perf_plant_slowdown"), "into": opt("perf_plant_into")}

    # Each arm reads its own tree's registry unless --perf-matrix names one: an older base cannot read
    # a newer registry's keys. The gate checks that both arms run the same prompts (harness/perf/ab/gate.py).
    matrix = opt("perf_matrix")

    def load_request(arm: str) -> dict[str, Any]:  # the candidate alone carries a planted slowdown
        return {"op": "load", "matrix": str(matrix) if matrix else None, "user_registry": session.matrix.user and
                str(Path(session.matrix.user).absolute()), "combination": combo.as_request(),
                "settings": dataclasses.asdict(session.settings), "plant": plant if arm == "candidate" else None}

    try:
        plan = duet.for_device(session.plan, combo.device, combo.id)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    session.environments = session.environments or ab_environments(session)  # the reference fallback: first use
    base_env, candidate_env = session.environments
    _decide_ab(session, combo, ABGate(combo, session.settings, Arm("base", base, env=plan.env(), environment=base_env),
                                      Arm("candidate", candidate, env=plan.env(), environment=candidate_env), load_request,
                                      _ab_settings(session), guard=LoadGuard(noise=session.noise), plan=plan), note)


def _ab_settings(session: PerfSession) -> ABSettings:
    return ABSettings(tolerance=session.config.getoption("perf_tolerance") or ABSettings().tolerance,
                      combinations=max(1, session.gated))


def _decide_ab(session: PerfSession, combo: Combination, gate: ABGate, note: str | None = None) -> None:
    """Run an A/B gate (live or replayed), record its result, and fail, warn or pass."""
    session.note(gate.plan.reason)
    try:
        result = gate.run(_ab_progress(session, combo))
    except HarnessError as exc:
        pytest.fail(f"{combo.id}: {exc}", pytrace=False)
    if note:
        result.notes.append(note)
    session.results.append(_ab_result(session, combo, result))
    opt = session.config.getoption
    if result.outcome == Outcome.REGRESSION or (result.outcome == Outcome.UNDECIDED and opt("perf_undecided") == "fail"):
        pytest.fail(result.message(), pytrace=False)
    if result.outcome == Outcome.UNDECIDED:
        warnings.warn(PerfUndecidedWarning(result.message() + "\n(--perf-undecided=fail makes this a failure)"))


def replay_gate(session: PerfSession, combo: Combination, request: pytest.FixtureRequest) -> None:
    """--perf-replay: decide the combination again from its recorded rounds (harness/perf/replay.py)."""
    recording = session.recording
    recorded = recording.get(combo.id)
    if recorded is None:
        pytest.skip(f"{combo.id}: not in the recording {recording.path}")
    if not recorded.rounds or (recorded.gate == "ab" and not recorded.base_rounds):
        pytest.skip(f"{combo.id}: the recording {recording.path} has no rounds of it (deferred, or not measured)")
    source = f"replayed from {recording.path} ({len(recorded.rounds)} recorded rounds)"
    if recorded.gate == "ab":
        plan = duet.Plan(recorded.mode, None, f"{source}: the arms' rounds as recorded ({recorded.mode})")
        gate = replay.ab_gate(combo, session.settings, _ab_settings(session),
                              replay.RecordedArm("base", recorded.base, recorded.base_rounds),
                              replay.RecordedArm("candidate", recorded.candidate, recorded.rounds), plan=plan)
        return _decide_ab(session, combo, gate)
    session.note(f"{source}: against the stored baseline, not confirmed (a confirmation needs fresh rounds)")
    baseline = _baseline_or_skip(session, combo)
    if baseline is None:
        pytest.fail(f"{combo.id}: a stored-gate recording replays against a stored baseline, and "
                    f"{session.baseline_path(combo.device)} has none for it", pytrace=False)
    runner = replay.RecordedRunner(combo, models.load_tokenizer(combo.selection.target.spec), session.settings,
                                   recorded=recorded.rounds)
    try:
        check_comparable(runner, baseline)
    except BaselineMismatchError as exc:
        pytest.fail(str(exc), pytrace=False)
    _measure(session, runner, None)
    verdict, result = _stored_verdict(session, runner, baseline, None)
    verdict.notes.append(source)
    session.results.append(result)
    _report(session, combo, verdict)


def _refuse_other_work(session: PerfSession, combo: Combination, check: Callable[[], None]) -> None:
    """Fail the test when `check` finds the baseline measured with other settings than this run."""
    try:
        check()
    except BaselineMismatchError as exc:
        pytest.fail(f"{exc} (then review and commit {session.baseline_path(combo.device)})", pytrace=False)


def _host_check(session: PerfSession, combo: Combination, baseline: dict[str, Any]) -> host.HostCheck:
    """Software versions and host speed against the baseline's (harness/perf/stored/host.py); its notes
    go to the end of the run once each."""
    probe = session.host_probe if combo.device == "cpu" else None  # the probe measures the CPU
    checked = host.check(baseline, str(session.baseline_path(combo.device)), software_versions(), probe,
                         threshold=session.config.getoption("perf_host_threshold"))
    session.note(*checked.notes)
    return checked


def _defer(session: PerfSession, combo: Combination, checked: host.HostCheck) -> None:
    """Neither PASS nor FAIL: this host is not comparable with the baseline's. Recorded as DEFERRED
    in results.json and the summary, and a skip (with the reason) in pytest, never a pass."""
    session.note(checked.deferred)
    session.results.append(CombinationResult(combo.id, session.platform_id(combo.device), "stored", Outcome.DEFERRED,
                                             [], notes=[*checked.notes, checked.deferred], host=checked.comparison))
    pytest.skip(f"{combo.id}: DEFERRED: {checked.deferred}")


def _stage(session: PerfSession, runner: Runner) -> CombinationResult:
    """--perf-update-baselines: the record to write at the end of the session, with this host's probe."""
    record = runner.baseline_record(git_commit())
    if runner.combo.device == "cpu":
        record["host_probe"] = session.host_probe()
    record["threads"] = session.placement_for(runner.combo.device).threads
    session.staged[runner.combo.id] = record
    return _result(session, runner, "update", Outcome.STAGED, tolerance=record["tolerance"])


def _stored_verdict(session: PerfSession, runner: Runner, baseline: dict[str, Any],
                    checked: host.HostCheck | None) -> tuple[Verdict, CombinationResult]:
    """The stored-baseline gate's verdict (confirmed, unless --perf-confirm off or the rounds are
    replayed: a confirmation needs fresh ones) and its result."""
    verdict = evaluate(runner, baseline)
    if session.config.getoption("perf_confirm") == "on" and runner.measures:
        verdict = confirm(runner, baseline, verdict)
    if checked is not None:
        verdict.notes[:0] = checked.notes
    return verdict, _result(session, runner, "stored", verdict.outcome, notes=verdict.notes,
                            decisions={m: d.as_dict() for m, d in verdict.decisions.items()},
                            exact=None if verdict.exact is None else verdict.exact.verdict,
                            host=None if checked is None else checked.comparison)


def _ab_progress(session: PerfSession, combo: Combination):
    """A line every few rounds on the terminal (a gate on the default pair takes minutes)."""
    started = time.perf_counter()

    def progress(done: int, decisions: dict[str, Any] | None) -> None:
        if done % 4:
            return
        last = "; ".join(f"{m} {d.change * 100:+.1f}% {d.verdict}" for m, d in (decisions or {}).items())
        session.say(f"A/B {combo.id}: {done} rounds, {(time.perf_counter() - started) / 60:.1f} min"
                    + (f" (last look: {last})" if last else ""))
    return progress


def _ab_result(session: PerfSession, combo: Combination, result: ABResult) -> CombinationResult:
    """The combination's entry of results.json: both arms' rounds, the paired ratios, the verdict."""
    cand = result.samples["candidate"]
    detail = ABDetail(base=result.base, candidate=result.candidate, mode=result.mode,
                      base_rounds=result.samples["base"], ratios=result.ratios, redone=result.redone,
                      restarts=result.restarts, behaviour_changes=result.counter_differences,
                      environments=_environments(result), swap_s=result.swap_s,
                      stand_in_rounds=result.stand_in_rounds, synced_rounds=result.synced_rounds)
    return CombinationResult(combo.id, session.platform_id(combo.device), "ab", result.outcome, cand,
                             acceptance_rate=acceptance_rate(cand[0].counters), notes=result.notes,
                             decisions={m: d.as_dict() for m, d in result.decisions.items()}, ab=detail)


def _environments(result: ABResult) -> dict[str, Any] | None:
    """The arms' environments as results.json keeps them (harness/perf/record.py ABDetail)."""
    if not result.environments:
        return None
    return {**{arm: env.to_json() for arm, env in result.environments.items()},
            "differences": {name: list(pair) for name, pair in result.environment_changes.items()}}


def _baseline_or_skip(session: PerfSession, combo: Combination) -> dict[str, Any] | None:
    """This combination's stored baseline; without one, fail or skip (--perf-missing-baseline)
    unless baselines are being written."""
    path = session.baseline_path(combo.device)
    try:
        doc = session.baseline_doc(combo.device)
    except baselines.BaselineError as exc:
        pytest.fail(str(exc), pytrace=False)
    baseline = (doc or {}).get("combinations", {}).get(combo.id)
    if baseline is None and not session.updating:
        message = (f"{combo.id}: no baseline on platform {session.platform_id(combo.device)} in {path}. "
                   f"Measure it with: pytest -m perf --perf-update-baselines -k '{combo.id}' (then review and commit "
                   f"{path.name}), or name a reference commit for the A/B gate (python -m harness reference move)")
        if reference.PATH.exists() and session.config.getoption("perf_missing_baseline") == "reference":
            return None
        if session.config.getoption("perf_missing_baseline") == "skip":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return baseline


def _measure(session: PerfSession, runner: Runner, benchmark: Any) -> None:
    """Warm up, then the first rounds (all of the cap when writing a baseline)."""
    runner.warmup()
    rounds = session.settings.rounds if not session.updating else session.settings.max_rounds
    if benchmark is not None:
        # with --benchmark-disable, pytest-benchmark runs the function once: the rest runs here
        benchmark.pedantic(runner.round, rounds=rounds, iterations=1)
    while runner.samples.rounds() < rounds and runner.rounds_left() > 0:
        runner.round()


def _result(session: PerfSession, runner: Runner, gate: str, outcome: Outcome, **fields: Any) -> CombinationResult:
    """The combination's entry of results.json from the runner's rounds (any extra rounds included)."""
    return CombinationResult(runner.combo.id, session.platform_id(runner.combo.device), gate, outcome,
                             list(runner.samples.items),
                             acceptance_rate=acceptance_rate(runner.exact_counters() or runner.samples.counters[0]),
                             **fields)


def _report(session: PerfSession, combo: Combination, verdict: Verdict) -> None:
    """Fail on a regression; warn (or fail, --perf-undecided fail) on an undecided metric."""
    message = verdict.message(session.platform_id(combo.device), str(session.baseline_path(combo.device)))
    if verdict.failed or (verdict.undecided and session.config.getoption("perf_undecided") == "fail"):
        pytest.fail(message, pytrace=False)
    if verdict.undecided:
        warnings.warn(PerfUndecidedWarning(message + "\n(--perf-undecided=fail makes this a failure)"))


