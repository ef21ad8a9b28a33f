"""pytest plugin of the perf gate: its options, hooks and fixture (like pytest-benchmark's); how a
combination runs through a gate is harness/perf/gates.py.

Registered by the package's pytest11 entry point (pyproject.toml), so its options exist wherever
pytest starts; conftest.py registers it from a checkout that is not installed. Options are namespaced under "perf gate" in --help and
validated at start-up; errors name the flag to fix.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.core import locks, termination
from harness.machine import hostspeed, platform, provenance
from harness.workload import registry
from harness.core.errors import HarnessError, did_you_mean
from harness.history import store as history_store
from harness.perf import benchmark_json, plant, replay, to_history
from harness.perf.ab import duet, loadguard
from harness.perf.combinations import combinations
from harness.perf.gates import PerfSession, ab_environments, ab_trees
from harness.perf.stored import baselines, host, placement

log = logging.getLogger(__name__)

_STATE = pytest.StashKey[PerfSession]()
_UNDO_SIGTERM = pytest.StashKey[Any]()
_SKIPPED: dict[str, str] = {}  # perf tests reported skipped in this process -> why


def _add_files_and_selection(g: Any) -> None:
    """Which combinations run, and the files a session reads and writes."""
    g.addoption("--perf-baselines-dir", "--baselines-dir", dest="perf_baselines_dir",
                default=str(baselines.DEFAULT_DIR), metavar="DIR",
                help="folder of <platform-id>.json baselines (default: baselines/)")
    g.addoption("--perf-update-baselines", "--update-baselines", dest="perf_update_baselines", action="store_true",
                help="measure and write this machine's baseline file (others are never touched)")
    g.addoption("--perf-pair", "--pair", dest="perf_pair", action="append", default=[], metavar="NAME",
                help="only these registry pairs (repeatable)")
    g.addoption("--perf-platform", "--platform", dest="perf_platform", action="append", default=[], metavar="NAME",
                help="only these registry platforms (repeatable), e.g. cpu, cuda")
    g.addoption("--perf-matrix", default=None, metavar="PATH", help="registry file (default: harness/matrix.toml)")
    g.addoption("--perf-user-registry", default=None, metavar="PATH",
                help="your own registry file merged over the packaged one (default: "
                     f"${registry.USER_REGISTRY_ENV} if set; docs/adding.md)")
    g.addoption("--perf-history", default=None, metavar="PATH",
                help="append this session's measurements to the run history at PATH, an SQLite file created if "
                     f"missing, or a postgresql:// URL (default: ${history_store.ENV} if set, else no history)")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("perf gate", "assisted-generation perf gate (harness/perf/plugin.py)")
    _add_files_and_selection(g)
    g.addoption("--perf-repeats", type=int, default=None, metavar="N",
                help="rounds (interleaved plain/assisted samples) before the first decision")
    g.addoption("--perf-max-repeats", type=int, default=None, metavar="N",
                help="cap on rounds while a decision is inconclusive")
    g.addoption("--perf-tolerance", type=float, default=None, metavar="FRACTION",
                help="the slowdown the gate must catch, as a fraction (e.g. 0.1 for 10%%); both gates call a "
                     "regression beyond half of it. Default: the A/B gate 10%%; the stored gate each baseline's "
                     "own tolerance, calibrated from its spread")
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
    g.addoption("--perf-plant-into", choices=plant.PLANT_INTO, default="target",
                help="where --perf-plant-slowdown goes: every forward pass of the target (default) or of the draft, "
                     "the target's verification passes only (verify), or host work before each verification "
                     "(glue: FRACTION of the previous verification pass, spun outside every pass)")
    g.addoption("--perf-plant-slowdown", type=float, default=0.0, metavar="FRACTION",
                help="check the gate itself: make what --perf-plant-into names FRACTION slower (e.g. 0.25)")
    _add_duet(g)
    g.addoption("--perf-threads", choices=placement.CHOICES, default=placement.ONE,
                help="stored-baseline gate: measure the host probe and the rounds with one thread pinned to one "
                     "core (one, default: steadier on a shared host) or with torch's threads on every core (all: "
                     "also sees how a step scales over threads); a baseline is checked only with the setting it "
                     "was measured with")
    g.addoption("--perf-replay", default=None, metavar="RESULTS_JSON",
                help="decide again from the rounds recorded in an earlier run's results.json (e.g. at another "
                     "--perf-tolerance), measuring nothing: A/B entries through the A/B gate, stored-gate entries "
                     "against the current baselines")
    g.addoption("--perf-against", default=None, metavar="REV",
                help="A/B gate: measure the working tree against git revision REV (sha, branch, tag, HEAD~1, or "
                     "'reference': baselines/reference.json) in "
                     "one job, instead of against stored baselines")
    g.addoption("--perf-base-python", default=None, metavar="PATH",
                help="A/B gate: run the base arm under this Python interpreter (another virtual environment's "
                     "bin/python) and the candidate under this one: a library upgrade gated like a commit; the "
                     "base runs the working tree's code, or REV's with --perf-against")
    g.addoption("--perf-base-env", default=None, metavar="SPEC",
                help="A/B gate: run the base arm in this environment with SPEC installed over it (a requirement "
                     "such as transformers==5.22.0, a local wheel, or a requirements file), built once into a "
                     "cached virtual environment; the results name both environments' versions")


def _add_duet(g: pytest.OptionGroup) -> None:
    """The A/B gate's side-by-side arms (harness/perf/ab/duet.py)."""
    g.addoption("--perf-duet", choices=duet.CHOICES, default="auto",
                help="A/B gate: run both arms' rounds at the same time, each on a core of its own with one thread, "
                     "swapping cores every round (on), or in turn with every core each (off); auto: side by side "
                     "where this process may use 2 cores, a GPU combination in turn (default)")
    g.addoption("--perf-duet-swap", type=float, default=duet.SWAP_S, metavar="SECONDS",
                help=f"A/B gate side by side: the arms also exchange cores every SECONDS within a round, so that "
                     f"a spell of one core running slower falls on both (default {duet.SWAP_S:g}; 0: between rounds only)")
    g.addoption(duet.SYNC_OPTION, choices=("on", "off"), default="off",
                help="A/B gate side by side: both arms start each run of a round (a prompt in one mode) together, the "
                     "first to finish waiting for the other with the stand-in on its core (on; where the base's worker "
                     "cannot, the arms start only each round together, and the notes say so), or only each round (off, default)")


# The options that had no --perf- prefix: still read under their old spelling, which says its new name once.
OLD_SPELLINGS = {"--pair": "--perf-pair", "--platform": "--perf-platform", "--baselines-dir": "--perf-baselines-dir",
                 "--update-baselines": "--perf-update-baselines"}


class PerfOptionRenamedWarning(UserWarning):
    """An option of the perf gate given by its spelling from before the --perf- prefix."""


def _note_old_spellings(config: pytest.Config) -> None:
    given = {str(arg).split("=", 1)[0] for arg in config.invocation_params.args}
    for old, new in OLD_SPELLINGS.items():
        if old in given:
            config.issue_config_time_warning(PerfOptionRenamedWarning(f"{old} is now {new} (the old spelling "
                                                                      "still works)"), stacklevel=2)


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
    if config.getoption("perf_base_python") and config.getoption("perf_base_env"):
        bad("--perf-base-python", "cannot be combined with --perf-base-env (the base runs in one environment)")
    for flag, dest in (("--perf-against", "perf_against"), ("--perf-base-python", "perf_base_python"),
                       ("--perf-base-env", "perf_base_env")):
        if config.getoption(dest) and config.getoption("perf_update_baselines"):
            bad(flag, "cannot be combined with --perf-update-baselines (an A/B run stores no baseline)")
    if planted and config.getoption("perf_update_baselines"):
        bad("--perf-plant-slowdown", "cannot be combined with --perf-update-baselines (it would store a slowed baseline)")
    if config.getoption("perf_replay"):
        for flag, dest in (("--perf-update-baselines", "perf_update_baselines"), ("--perf-against", "perf_against"),
                           ("--perf-plant-slowdown", "perf_plant_slowdown"), ("--perf-base-python", "perf_base_python"),
                           ("--perf-base-env", "perf_base_env")):
            if config.getoption(dest):
                bad("--perf-replay", f"cannot be combined with {flag} (a replay measures nothing)")
    directory = Path(config.getoption("perf_baselines_dir"))
    if directory.exists() and not directory.is_dir():
        bad("--perf-baselines-dir", f"{directory} is not a folder")
    if not directory.exists() and not config.getoption("perf_update_baselines"):
        # without it, no combination would find a baseline and each would silently gate A/B instead
        bad("--perf-baselines-dir", f"{directory} does not exist (mistyped?); to store baselines there, add "
                                    "--perf-update-baselines")


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered: a base environment's build says its steps there
def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI job cancelled) ends the session as Ctrl-C does: fixtures torn down, A/B workers and
    # sandboxed runs closed, their folders and logs removed (harness/core/termination.py)
    config.stash[_UNDO_SIGTERM] = termination.install()
    _note_old_spellings(config)
    _check_options(config)
    try:
        matrix = registry.load_matrix(config.getoption("perf_matrix"), user=config.getoption("perf_user_registry"))
    except HarnessError as exc:
        raise pytest.UsageError(f"--perf-matrix: {exc}") from None
    try:
        combos = combinations(matrix)
    except HarnessError as exc:
        raise pytest.UsageError(f"--perf-matrix: {exc}") from None
    known_pairs = {c.pair for c in combos}
    for name in config.getoption("perf_pair"):
        if name not in known_pairs:
            raise pytest.UsageError(f"--perf-pair {name!r} has no perf combinations.{did_you_mean(name, known_pairs)} "
                                    f"Available: {', '.join(sorted(known_pairs))}")
    for name in config.getoption("perf_platform"):
        if name not in matrix.platforms:
            raise pytest.UsageError(f"--perf-platform {name!r} is not in the registry; available: "
                                    f"{', '.join(matrix.platforms)}")
    session = PerfSession(config, matrix, combos)
    try:
        session.plan = duet.plan(config.getoption("perf_duet"), swap_s=config.getoption("perf_duet_swap"),
                                 sync=config.getoption("perf_duet_sync") == "on")
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        session.placement = placement.resolve(config.getoption("perf_threads"))
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        session.noise = loadguard.noise_pids()
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    session.history = _history(config)
    if config.getoption("perf_replay"):
        try:
            session.recording = replay.Recording.load(Path(config.getoption("perf_replay")))
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
    against = config.getoption("perf_against")
    if against or config.getoption("perf_base_python") or config.getoption("perf_base_env"):
        try:
            session.trees = ab_trees(session, against)
        except HarnessError as exc:
            message = str(exc)
            prefix = f"--perf-against {against}: "
            raise pytest.UsageError(message if message.startswith("--perf-against") else prefix + message) from None
        try:
            session.environments = ab_environments(session)
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.stash[_STATE] = session


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash.get(_UNDO_SIGTERM, lambda: None)()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "perf_combination" not in metafunc.fixturenames:
        return
    state: PerfSession = metafunc.config.stash[_STATE]
    pairs, platforms = metafunc.config.getoption("perf_pair"), metafunc.config.getoption("perf_platform")
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
        state.nodeids = {i.callspec.id: i.nodeid for i in session.items if hasattr(i, "callspec")}


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state: PerfSession | None = session.config.stash.get(_STATE, None)
    if state is None:
        return
    try:
        if (state.gated and not state.updating and not session.config.option.collectonly
                and state.counts(len(_SKIPPED))["gated"] == 0 and session.exitstatus == 0):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a perf run that gated nothing is not a pass
        # Each writer on its own: a baseline file that cannot be written must not cost the report and the
        # history of the same rounds (nor they it), or minutes of measurement are lost.
        _keeping(state, session, _write_baselines, state, exitstatus)
        if state.results:
            origin = provenance.collect(host_probe=state.probe)  # the stored gate's probe, if taken
            _keeping(state, session, _write_reports, state, session, origin)
            _keeping(state, session, _append_history, state, session.config, origin)
            _keeping(state, session, _write_benchmark_json, state, session)
    except (HarnessError, OSError) as exc:  # outside the writers: collecting the results' provenance
        _failed(state, session, exc)
    finally:
        state.held.close()  # the A/B gate's lock: the next gate on this repository may start


def _keeping(state: PerfSession, session: pytest.Session, write: Callable[..., None], *args: Any) -> None:
    """Run one of the session's writers; its error becomes a summary line and fails the run."""
    try:
        write(*args)
    except (HarnessError, OSError) as exc:
        _failed(state, session, exc)


def _failed(state: PerfSession, session: pytest.Session, exc: Exception) -> None:
    state.update_lines.append(f"error: {exc}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_reports(state: PerfSession, session: pytest.Session, origin: provenance.Provenance) -> None:
    """results/perf/ (--perf-report-dir): results.json, summary.md and the figures."""
    from harness.perf import report as perf_report

    perf_report.write_all(state.results, Path(session.config.getoption("perf_report_dir")), origin)


def _write_benchmark_json(state: PerfSession, session: pytest.Session) -> None:
    """--benchmark-json with benchmarks disabled (the make targets): pytest-benchmark writes nothing,
    so the gate's rounds are written here (harness/perf/benchmark_json.py)."""
    path = session.config.getoption("benchmark_json", None)
    bench_session = getattr(session.config, "_benchmarksession", None)
    if path and (bench_session is None or bench_session.disabled):
        benchmark_json.write(path, state.results, state.nodeids, session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Benchmarks enabled: pytest-benchmark's file has the stored gate's rounds; the A/B gate's are added."""
    state: PerfSession | None = config.stash.get(_STATE, None)
    if state is not None and state.results:
        output_json["benchmarks"] += benchmark_json.entries(state.results, state.nodeids, ab_only=True)


def _history(config: pytest.Config) -> str | Path | None:
    """--perf-history (else $HARNESS_HISTORY), opened once at configure: a history that cannot be opened
    or reached stops the run before any model loads, not after the gate."""
    option = config.getoption("perf_history")
    try:
        where = history_store.location(option) if option is not None else history_store.default_path()
        if where is not None:
            history_store.open_store(where).close()
    except (ValueError, HarnessError) as exc:
        raise pytest.UsageError(f"--perf-history: {exc}") from None
    return where


def _append_history(state: PerfSession, config: pytest.Config, origin: provenance.Provenance) -> None:
    """--perf-history: this session's runs appended to the history, one line each for the summary."""
    if state.history is None:
        return
    with history_store.open_store(state.history) as store:
        for run in to_history.runs(state.results, origin):
            run_id, new = store.append(run)
            state.note(f"history: {run.kind} run {run_id} {'appended to' if new else 'already in'} {store.name} "
                       f"({len(run.measurements)} measurements)")


def _write_baselines(state: PerfSession, exitstatus: int) -> None:
    """Merge the staged records into each platform's file: under that file's lock, re-read, so that
    two update runs at once (other pairs, other combinations) both keep what they measured."""
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
        with locks.held(baselines.lock_for(path), what=f"writing {path}", on_wait=state.say, guards=path.parent):
            old = baselines.load(path, platform_id=state.platform_id(device), cpu_class=platform.detect(device).capability)
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
    for line in perf_report.summary_lines(state.results) if state.results else []:
        terminalreporter.write_line(line)
    for line in state.update_lines + state.notes:
        terminalreporter.write_line(line)
    if state.results:
        terminalreporter.write_line(f"reports: {config.getoption('perf_report_dir')}/"
                                    "{results.json, summary.md, speedup.png}")
    c = state.counts(len(_SKIPPED))
    line = (f"perf gate: {c['gated']} gated, {c['regressed']} regressed, {c['undecided']} undecided, "
            f"{c['skipped']} skipped{skip_reasons(_SKIPPED)}")
    if c["deferred"]:
        line += (f" ({c['deferred']} deferred: this host is not comparable with the baselines' host; "
                 f"gate them A/B: {host.AB_COMMAND})")
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        line += " -- stopped (interrupted): a combination still measuring is dropped, not decided"
    elif c["gated"] == 0 and not state.updating and not config.option.collectonly:
        line += " -- nothing was gated, so this run FAILS: measure a baseline or name a reference commit"
    terminalreporter.write_line(line, bold=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "::test_perf[" in report.nodeid:
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED[report.nodeid] = str(why).removeprefix("Skipped: ")


def skip_reasons(skipped: dict[str, str]) -> str:
    """' (2 cuda: no CUDA device ..., 1 ...)': the skips counted by reason, most frequent first. A reason
    loses the combination id it starts with; deferrals are left to the line's own deferred count."""
    def reason(nodeid: str, why: str) -> str:
        combo = nodeid.rsplit("::test_perf[", 1)[-1].rstrip("]")
        return why.removeprefix(f"{combo}: ").split(". ")[0]  # its first sentence
    counts = Counter(r for r in (reason(n, w) for n, w in skipped.items()) if not r.startswith("DEFERRED:"))
    return f" ({', '.join(f'{n} {why}' for why, n in counts.most_common())})" if counts else ""
