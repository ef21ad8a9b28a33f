"""pytest plugin of the perf gate: every option and hook in one module (like pytest-benchmark's).

Registered by the package's pytest11 entry point (pyproject.toml), so its options exist wherever
pytest starts; conftest.py registers it from a checkout that is not installed. Options are namespaced under "perf gate" in --help and
validated at start-up; errors name the flag to fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import harness
from harness.core import hostspeed, platform, registry
from harness.core.errors import HarnessError, did_you_mean
from harness.core.generate import ASSISTED
from harness.perf import baselines, host, reference, revision
from harness.perf.ab import ABGate, ABResult, ABSettings
from harness.perf.arms import Arm
from harness.perf.combinations import Combination, PerfSettings, combinations
from harness.perf.runner import (METRICS, LoadedPair, Runner, acceptance_rate, git_commit, load_pair,
                                 software_versions)
from harness.perf.verdict import BaselineMismatchError, Verdict, check_comparable, confirm, evaluate

log = logging.getLogger(__name__)

_STATE = pytest.StashKey["PerfSession"]()
_SKIPPED: set[str] = set()  # perf tests reported skipped in this process


class PerfUndecidedWarning(UserWarning):
    """The perf gate could not decide within its sample cap (see --perf-undecided)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("perf gate", "assisted-generation perf gate (harness/perf/plugin.py)")
    g.addoption("--baselines-dir", default=str(baselines.DEFAULT_DIR), metavar="DIR",
                help="folder of <platform-id>.json baselines (default: baselines/)")
    g.addoption("--update-baselines", action="store_true",
                help="measure and write this machine's baseline file (others are never touched)")
    g.addoption("--pair", action="append", default=[], metavar="NAME",
                help="only these registry pairs (repeatable)")
    g.addoption("--platform", action="append", default=[], metavar="NAME",
                help="only these registry platforms (repeatable), e.g. cpu, cuda")
    g.addoption("--perf-repeats", type=int, default=None, metavar="N",
                help="rounds (interleaved plain/assisted samples) before the first decision")
    g.addoption("--perf-max-repeats", type=int, default=None, metavar="N",
                help="cap on rounds while a decision is inconclusive")
    g.addoption("--perf-tolerance", type=float, default=None, metavar="FRACTION",
                help="override the calibrated tolerance of every baseline, e.g. 0.1 for 10%%")
    g.addoption("--perf-missing-baseline", choices=("reference", "fail", "skip"), default="reference",
                help="a combination without a stored baseline on this platform: gate it A/B against the reference "
                     "commit (default; baselines/reference.json), fail, or skip")
    g.addoption("--perf-undecided", choices=("warn", "fail"), default="warn",
                help="a metric still undecided at --perf-max-repeats (the machine was too noisy to tell a "
                     "tolerance-sized change from none): warn (default; shown as UNDECIDED in the summary and "
                     "as a warning) or fail")
    g.addoption("--perf-confirm", choices=("on", "off"), default="on",
                help="a statistical FAIL is measured again with fresh rounds and reported only if it fails "
                     "again; a failure seen once becomes UNDECIDED (default: on; off is faster when a "
                     "regression is expected)")
    g.addoption("--perf-host-threshold", type=float, default=hostspeed.THRESHOLD, metavar="FRACTION",
                help="how far a rate of this host's speed probe may be from the one stored with a baseline before "
                     f"the stored gate defers to the A/B gate (default {hostspeed.THRESHOLD}; widen it on a host "
                     "whose own probe spreads more: benchmarks/hostspeed_spread.py measures that)")
    g.addoption("--perf-report-dir", default="results/perf", metavar="DIR",
                help="where results.json, summary.md and speedup.png go (default: results/perf)")
    g.addoption("--perf-plant-into", choices=("target", "draft"), default="target",
                help="which model --perf-plant-slowdown slows: the target (default; the absolute gate must "
                     "catch it) or the draft (the relative gate, speedup, must catch it)")
    g.addoption("--perf-plant-slowdown", type=float, default=0.0, metavar="FRACTION",
                help="check the gate itself: make the forward pass of the target (or, with --perf-plant-into "
                     "draft, the draft) FRACTION slower (e.g. 0.25)")
    g.addoption("--perf-matrix", default=None, metavar="PATH", help="registry file (default: harness/matrix.toml)")
    g.addoption("--perf-against", default=None, metavar="REV",
                help="A/B gate: measure the working tree against git revision REV (sha, branch, tag, HEAD~1, or "
                     "'reference': baselines/reference.json) in "
                     "one job, interleaved, instead of against stored baselines; --perf-tolerance is the change "
                     f"to catch (default {ABSettings().tolerance * 100:.0f}%%)")


def _check_options(config: pytest.Config) -> None:
    def bad(flag: str, why: str) -> None:
        raise pytest.UsageError(f"{flag}: {why}")

    repeats, cap = config.getoption("perf_repeats"), config.getoption("perf_max_repeats")
    if repeats is not None and repeats < 2:
        bad("--perf-repeats", f"{repeats}: at least 2 rounds are needed for a spread")
    if cap is not None and cap < (repeats or 2):
        bad("--perf-max-repeats", f"{cap}: must be at least --perf-repeats ({repeats or 2})")
    tol = config.getoption("perf_tolerance")
    if tol is not None and not 0 < tol < 1:  # NaN fails the comparison too
        bad("--perf-tolerance", f"{tol}: give a fraction between 0 and 1, e.g. 0.1 for 10%")
    host_threshold = config.getoption("perf_host_threshold")
    if not host_threshold > 0:  # NaN fails the comparison too
        bad("--perf-host-threshold", f"{host_threshold}: give a fraction above 0, e.g. 0.25 for 25%")
    planted = config.getoption("perf_plant_slowdown")
    if not 0 <= planted <= 10:
        bad("--perf-plant-slowdown", f"{planted}: give a fraction between 0 and 10")
    if config.getoption("perf_against") and config.getoption("update_baselines"):
        bad("--perf-against", "cannot be combined with --update-baselines (an A/B run stores no baseline)")
    if planted and config.getoption("update_baselines"):
        bad("--perf-plant-slowdown", "cannot be combined with --update-baselines (it would store a slowed baseline)")
    directory = Path(config.getoption("baselines_dir"))
    if directory.exists() and not directory.is_dir():
        bad("--baselines-dir", f"{directory} is not a folder")


def pytest_configure(config: pytest.Config) -> None:
    _check_options(config)
    try:
        matrix = registry.load_matrix(config.getoption("perf_matrix"))
    except HarnessError as exc:
        raise pytest.UsageError(f"--perf-matrix: {exc}") from None
    try:
        combos = combinations(matrix)
    except HarnessError as exc:
        raise pytest.UsageError(f"--perf-matrix: {exc}") from None
    known_pairs = {c.pair for c in combos}
    for name in config.getoption("pair"):
        if name not in known_pairs:
            raise pytest.UsageError(f"--pair {name!r} has no perf combinations.{did_you_mean(name, known_pairs)} "
                                    f"Available: {', '.join(sorted(known_pairs))}")
    for name in config.getoption("platform"):
        if name not in matrix.platforms:
            raise pytest.UsageError(f"--platform {name!r} is not in the registry; available: "
                                    f"{', '.join(matrix.platforms)}")
    session = PerfSession(config, matrix, combos)
    if config.getoption("perf_against"):
        try:
            session.trees = ab_trees(config.getoption("perf_against"))
        except HarnessError as exc:
            message = str(exc)
            prefix = f"--perf-against {config.getoption('perf_against')}: "
            raise pytest.UsageError(message if message.startswith("--perf-against") else prefix + message) from None
    config.stash[_STATE] = session


def ab_trees(rev: str) -> tuple[revision.Tree, revision.Tree]:
    """(base, candidate) of the A/B gate: REV (or the reference commit) checked out, and the working tree."""
    repo = revision.repository_root(Path(harness.__file__).parent)
    sha = reference.read().commit if rev == reference.NAME else rev
    return revision.checkout(repo, sha, label=rev), revision.working_tree(repo)


class PerfSession:
    """Session state: the loaded models (one pair at a time), baselines, staged updates, results."""

    def __init__(self, config: pytest.Config, matrix: registry.Matrix, combos: list[Combination]):
        self.config, self.matrix, self.combinations = config, matrix, combos
        self.settings = PerfSettings.from_matrix(
            matrix, rounds=config.getoption("perf_repeats"), max_rounds=config.getoption("perf_max_repeats"),
            tolerance_override=config.getoption("perf_tolerance"))
        if self.settings.max_rounds < self.settings.rounds:
            self.settings = PerfSettings(**{**self.settings.__dict__, "max_rounds": self.settings.rounds})
        self.directory = Path(config.getoption("baselines_dir"))
        self.updating = config.getoption("update_baselines")
        self.loaded: LoadedPair | None = None
        self.staged: dict[str, dict[str, Any]] = {}
        self.results: list[dict[str, Any]] = []
        self._baseline_docs: dict[str, dict[str, Any] | None] = {}  # device -> that platform's file, read once
        self.update_lines: list[str] = []
        self.trees: tuple[revision.Tree, revision.Tree] | None = None  # --perf-against: (base, candidate)
        self.reference_trees: tuple[revision.Tree, revision.Tree] | None = None  # no stored baseline here
        self.gated = 0  # perf tests selected to run (the A/B gate's family of tests)
        self.notes: list[str] = []  # lines for the end of the run: software changes, host checks (once each)
        self.probe: dict[str, Any] | None = None  # this host's speed probe, measured once when first needed

    # models: one pair in memory at a time (24 GiB here)
    def models_for(self, combo: Combination) -> LoadedPair:
        if combo.device == "cpu":
            # before the first model loads, in update and check alike: in a process that holds GBs
            # of models the memory rate came out 35% above a fresh process's on the same host
            self.host_probe()
        if self.loaded is None or self.loaded.key != combo.model_key:
            self.loaded = None
            gc.collect()
            self.loaded = load_pair(self.matrix, combo,
                                         slowdown=self.config.getoption("perf_plant_slowdown"),
                                         plant_into=self.config.getoption("perf_plant_into"))
        return self.loaded

    def counts(self) -> dict[str, int]:
        verdicts = [r["verdict"] for r in self.results if r["verdict"] not in ("baseline staged", host.DEFERRED)]
        return {"gated": len(verdicts), "regressed": sum(v in ("fail", "regression") for v in verdicts),
                "undecided": verdicts.count("undecided"), "skipped": len(_SKIPPED),
                "deferred": sum(r["verdict"] == host.DEFERRED for r in self.results)}

    def note(self, *lines: str) -> None:
        self.notes += [line for line in lines if line not in self.notes]

    def host_probe(self) -> dict[str, Any]:
        if self.probe is None:
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "perf_combination" not in metafunc.fixturenames:
        return
    state: PerfSession = metafunc.config.stash[_STATE]
    pairs, platforms = metafunc.config.getoption("pair"), metafunc.config.getoption("platform")
    params = []
    for combo in state.combinations:
        if (pairs and combo.pair not in pairs) or (platforms and combo.platform not in platforms):
            continue
        marks = [pytest.mark.perf]
        if combo.slow:
            marks.append(pytest.mark.slow)
        if combo.device == "cuda":
            marks.append(pytest.mark.gpu)
        if reason := platform.device_available(combo.device):
            marks.append(pytest.mark.skip(reason=f"{combo.platform}: {reason}"))
        params.append(pytest.param(combo, id=combo.id, marks=marks))
    metafunc.parametrize("perf_combination", params)


def pytest_collection_finish(session: pytest.Session) -> None:
    state: PerfSession | None = session.config.stash.get(_STATE, None)
    if state is not None:
        # the perf tests that will run (a device missing here is a skip marked at collection)
        state.gated = sum(1 for i in session.items if i.get_closest_marker("skip") is None
                          and "perf_combination" in getattr(getattr(i, "callspec", None), "params", {}))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group perf tests by loaded models so each pair loads once; keep the rest in place."""
    def key(item: pytest.Item) -> tuple:
        callspec = getattr(item, "callspec", None)
        combo = callspec.params.get("perf_combination") if callspec else None
        return (0,) if combo is None else (1, combo.model_key, combo.id)
    perf_items = sorted((i for i in items if key(i)[0] == 1), key=key)
    others = [i for i in items if key(i)[0] == 0]
    items[:] = others + perf_items


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest) -> PerfSession:
    return request.config.stash[_STATE]


def run_gate(session: PerfSession, combo: Combination, request: pytest.FixtureRequest) -> None:
    """Measure one combination and apply the gates (or stage its new baseline). The stored-baseline
    gate times its rounds through pytest-benchmark's fixture; the A/B gate's rounds run in workers."""
    if (session.config.getoption("perf_plant_slowdown") and session.config.getoption("perf_plant_into") == "draft"
            and combo.mode != ASSISTED):
        pytest.skip(f"{combo.id}: --perf-plant-into draft: this combination has no draft model ({combo.mode})")
    if session.trees is not None:
        return run_ab_gate(session, combo, session.trees)
    baseline = _baseline_or_skip(session, combo)
    if baseline is None and not session.updating:  # no stored baseline here: A/B against the reference
        log.warning("%s: no stored baseline on this platform; gating A/B against the reference commit", combo.id)
        try:
            session.reference_trees = session.reference_trees or ab_trees(reference.NAME)
        except HarnessError as exc:
            pytest.fail(f"{combo.id}: no stored baseline, and the A/B gate against the reference cannot run: {exc}",
                        pytrace=False)
        return run_ab_gate(session, combo, session.reference_trees, note="no stored baseline on this platform: gated A/B against the "
                                                "reference commit (baselines/reference.json)")
    checked = None if baseline is None or session.updating else _host_check(session, combo, baseline)
    if checked is not None and checked.deferred:
        return _defer(session, combo, checked)
    benchmark = request.getfixturevalue("benchmark")
    runner = Runner(session.matrix, combo, session.models_for(combo), session.settings)
    if checked is not None:  # a stored baseline to compare with
        try:
            check_comparable(runner, baseline)
        except BaselineMismatchError as exc:
            pytest.fail(f"{exc} (then review and commit {session.baseline_path(combo.device)})", pytrace=False)
    _measure(session, runner, benchmark)
    result = _result(session, runner)
    verdict = None
    if session.updating:
        _stage(session, runner, result)
    else:
        verdict = _stored_verdict(session, runner, baseline, checked, result)
    for name in METRICS:  # after evaluate: includes any extra rounds
        result[name] = list(runner.samples.metric(name))
    session.results.append(result)
    if benchmark is not None:
        benchmark.extra_info.update({"combination": combo.id, "verdict": result["verdict"],
                                     "acceptance_rate": result["acceptance_rate"],
                                     **{f"{m}_samples": result[m] for m in METRICS}})
    if verdict is not None:
        _report(session, combo, verdict)


def run_ab_gate(session: PerfSession, combo: Combination, trees: tuple[revision.Tree, revision.Tree],
                note: str | None = None) -> None:
    """The A/B gate: the working tree against a base revision, in one job (harness/perf/ab.py)."""
    base, candidate = trees
    opt = session.config.getoption
    plant = {"fraction": opt("perf_plant_slowdown"), "into": opt("perf_plant_into")}

    # Each arm reads its own tree's registry unless --perf-matrix names one: an older base cannot read
    # a newer registry's keys. The gate checks that both arms run the same prompts (harness/perf/ab.py).
    matrix = opt("perf_matrix")

    def load_request(arm: str) -> dict[str, Any]:  # the candidate alone carries a planted slowdown
        return {"op": "load", "matrix": str(matrix) if matrix else None, "combination": combo.as_request(),
                "settings": dataclasses.asdict(session.settings), "plant": plant if arm == "candidate" else None}

    settings = ABSettings(tolerance=opt("perf_tolerance") or ABSettings().tolerance,
                          tests=len(METRICS) * max(1, session.gated))
    try:
        result = ABGate(combo, session.settings, Arm("base", base), Arm("candidate", candidate), load_request,
                        settings).run(_ab_progress(session.config, combo))
    except HarnessError as exc:
        pytest.fail(f"{combo.id}: {exc}", pytrace=False)
    if note:
        result.notes.append(note)
    session.results.append(_ab_record(session, combo, result))
    if result.outcome == "regression" or (result.outcome == "undecided" and opt("perf_undecided") == "fail"):
        pytest.fail(result.message(), pytrace=False)
    if result.outcome == "undecided":
        warnings.warn(PerfUndecidedWarning(result.message() + "\n(--perf-undecided=fail makes this a failure)"))


def _host_check(session: PerfSession, combo: Combination, baseline: dict[str, Any]) -> host.HostCheck:
    """Software versions and host speed against the baseline's (harness/perf/host.py); its notes
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
    session.results.append({"combination": combo.id, "platform": session.platform_id(combo.device),
                            "verdict": host.DEFERRED, "notes": [*checked.notes, checked.deferred],
                            "host": checked.comparison, "acceptance_rate": None, **{m: [] for m in METRICS}})
    pytest.skip(f"{combo.id}: DEFERRED: {checked.deferred}")


def _stage(session: PerfSession, runner: Runner, result: dict[str, Any]) -> None:
    """--update-baselines: the record to write at the end of the session, with this host's probe."""
    record = runner.baseline_record(git_commit())
    if runner.combo.device == "cpu":
        record["host_probe"] = session.host_probe()
    session.staged[runner.combo.id] = record
    result.update(verdict="baseline staged", tolerance=record["tolerance"])


def _stored_verdict(session: PerfSession, runner: Runner, baseline: dict[str, Any], checked: host.HostCheck | None,
                    result: dict[str, Any]) -> Verdict:
    """The stored-baseline gate's verdict (confirmed, unless --perf-confirm off), into `result`."""
    verdict = evaluate(runner, baseline)
    if session.config.getoption("perf_confirm") == "on":
        verdict = confirm(runner, baseline, verdict)
    if checked is not None:
        verdict.notes[:0] = checked.notes
        if checked.comparison is not None:
            result["host"] = checked.comparison
    result.update(verdict=verdict.outcome, decisions={m: d.as_dict() for m, d in verdict.decisions.items()},
                  exact=None if verdict.exact is None else verdict.exact.verdict, notes=verdict.notes,
                  rounds=verdict.rounds)
    return verdict


def _ab_progress(config: pytest.Config, combo: Combination):
    """A line every few rounds on the terminal (a gate on the default pair takes minutes)."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")  # output inside a test is captured
    started = time.perf_counter()

    def progress(done: int, decisions: dict[str, Any] | None) -> None:
        if terminal is None or done % 4:
            return
        last = "; ".join(f"{m} {d.change * 100:+.1f}% {d.verdict}" for m, d in (decisions or {}).items())
        line = (f"A/B {combo.id}: {done} rounds, {(time.perf_counter() - started) / 60:.1f} min"
                + (f" (last look: {last})" if last else ""))
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            terminal.ensure_newline()
            terminal.write_line(line)
    return progress


def _ab_record(session: PerfSession, combo: Combination, result: ABResult) -> dict[str, Any]:
    """The combination's entry of results.json: the candidate's samples, the paired ratios, the verdict."""
    cand = result.samples["candidate"]
    return {"combination": combo.id, "platform": session.platform_id(combo.device), "verdict": result.outcome,
            "mode": "ab", "base": result.base, "candidate": result.candidate, "rounds": result.rounds,
            "redone": result.redone, "restarts": result.restarts, "ratios": result.ratios,
            "ab_decisions": {m: d.as_dict() for m, d in result.decisions.items()},
            "behaviour_changes": result.counter_differences,
            "acceptance_rate": acceptance_rate(cand[0]["counters"]), **{m: [s[m] for s in cand] for m in METRICS}}


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
                   f"Measure it with: pytest -m perf --update-baselines -k '{combo.id}' (then review and commit "
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
    while runner.samples.rounds() < rounds:
        runner.round()


def _result(session: PerfSession, runner: Runner) -> dict[str, Any]:
    """The combination's entry of results.json, before its verdict."""
    return {"combination": runner.combo.id, "platform": session.platform_id(runner.combo.device),
            "acceptance_rate": acceptance_rate(runner.exact_counters() or runner.samples.counters[0])}


def _report(session: PerfSession, combo: Combination, verdict: Verdict) -> None:
    """Fail on a regression; warn (or fail, --perf-undecided fail) on an undecided metric."""
    message = verdict.message(session.platform_id(combo.device), str(session.baseline_path(combo.device)))
    if verdict.failed or (verdict.undecided and session.config.getoption("perf_undecided") == "fail"):
        pytest.fail(message, pytrace=False)
    if verdict.undecided:
        warnings.warn(PerfUndecidedWarning(message + "\n(--perf-undecided=fail makes this a failure)"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state: PerfSession | None = session.config.stash.get(_STATE, None)
    if state is None:
        return
    if (state.gated and not state.updating and not session.config.option.collectonly
            and state.counts()["gated"] == 0 and session.exitstatus == 0):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a perf run that gated nothing is not a pass
    if state.results:
        from harness.perf import report as perf_report

        perf_report.write_all(state.results, Path(session.config.getoption("perf_report_dir")))
    if not state.updating or not state.staged:
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        log.warning("interrupted: baselines not written")
        state.update_lines = ["interrupted: no baseline written; the old file is unchanged"]
        return
    by_device: dict[str, dict[str, Any]] = {}
    for cid, record in state.staged.items():
        combo = next(c for c in state.combinations if c.id == cid)
        by_device.setdefault(combo.device, {})[cid] = record
    lines = []
    for device, records in by_device.items():
        path = state.baseline_path(device)
        old = state.baseline_doc(device)
        new = baselines.merged(old, platform.detect(device).hardware(), platform.software(), records)
        baselines.write(path, new)
        changed = baselines.changes(old, new)
        lines.append(f"wrote {path} ({len(records)} combination(s) measured):")
        lines += ["  " + c for c in changed] or ["  (no change)"]
        if old is None:  # a new platform: what it measured against the nearest known one
            lines += baselines.nearest_lines(state.directory, new, path, state.probe)
    state.update_lines = lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state: PerfSession | None = config.stash.get(_STATE, None)
    if state is None or not state.gated:
        return
    from harness.perf import report as perf_report

    terminalreporter.section("perf gate")
    if state.results:
        for line in perf_report.summary_lines(state.results):
            terminalreporter.write_line(line)
        for line in state.update_lines + state.notes:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"reports: {config.getoption('perf_report_dir')}/"
                                    "{results.json, summary.md, speedup.png}")
    c = state.counts()
    line = f"perf gate: {c['gated']} gated, {c['regressed']} regressed, {c['undecided']} undecided, {c['skipped']} skipped"
    if c["deferred"]:
        line += (f" ({c['deferred']} deferred: this host is not comparable with the baselines' host; "
                 f"gate them A/B: {host.AB_COMMAND})")
    if c["gated"] == 0 and not state.updating and not config.option.collectonly:
        line += " -- nothing was gated, so this run FAILS: measure a baseline or name a reference commit"
    terminalreporter.write_line(line, bold=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "::test_perf[" in report.nodeid:
        _SKIPPED.add(report.nodeid)
