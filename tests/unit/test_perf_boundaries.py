"""Where the perf gate meets bad input: each device reads and writes its own platform's baseline
file, a baseline measured with other settings is refused (never compared), and a malformed
[perf] table is a one-line error that names the file."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.core.childenv import python_path
from harness.machine import hostspeed, platform, provenance
from harness.workload import registry
from harness.core.errors import HarnessError, RegistryError
from harness.perf import gates, plugin
from harness.perf.stored import baselines, placement
from harness.perf import report as perf_report
from harness.perf.combinations import PerfSettings, combinations
from harness.measure import interleave
from harness.workload.decode import PLAIN
from harness.perf.runner import Runner, load_pair
from harness.perf.stored.verdict import BaselineMismatchError, check_comparable
from tiny_models import write_local_matrix

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "baselines").glob("cpu-*.json"))[0]  # a real record to build documents from


def fake_config(directory: Path, **options) -> SimpleNamespace:
    values = {"perf_repeats": None, "perf_max_repeats": None, "perf_tolerance": None, "perf_baselines_dir": str(directory),
              "perf_update_baselines": False, "perf_plant_slowdown": 0.0, "perf_plant_into": "target",
              "perf_report_dir": str(directory / "reports"), "perf_host_threshold": hostspeed.THRESHOLD, **options}
    return SimpleNamespace(getoption=values.__getitem__, stash=pytest.Stash())


def document(device: str, combination_ids: list[str]) -> dict:
    """A baseline file of these combinations, each a copy of a committed record, measured (as its
    `threads` says) the way a PerfSession built here measures: on every core, the session's own
    default before --perf-threads is read at configure."""
    template = next(iter(json.loads(COMMITTED.read_text())["combinations"].values()))
    template["threads"] = placement.EVERY_CORE.threads
    return {"schema_version": baselines.SCHEMA_VERSION, "platform": platform.detect(device).hardware(),
            "software": platform.software(), "combinations": {cid: copy.deepcopy(template) for cid in combination_ids}}


@pytest.fixture()
def two_devices(tmp_path):
    """A baseline file for the CPU platform and one for the CUDA platform, with different entries."""
    matrix = registry.load_matrix()
    combos = combinations(matrix)
    cpu = next(c for c in combos if c.device == "cpu")
    cuda = next(c for c in combos if c.device == "cuda")
    for device, combo in (("cpu", cpu), ("cuda", cuda)):
        baselines.write(baselines.path_for(tmp_path, platform.detect(device).id), document(device, [combo.id]))
    return matrix, combos, cpu, cuda


def test_each_device_reads_its_own_platform_file(tmp_path, two_devices):
    matrix, combos, cpu, cuda = two_devices
    session = plugin.PerfSession(fake_config(tmp_path), matrix, combos)
    assert set(session.baseline_doc("cpu")["combinations"]) == {cpu.id}
    assert set(session.baseline_doc("cuda")["combinations"]) == {cuda.id}  # not the CPU document again


def test_an_update_merges_each_device_into_its_own_file(tmp_path, two_devices):
    matrix, combos, cpu, cuda = two_devices
    config = fake_config(tmp_path, perf_update_baselines=True)
    session = plugin.PerfSession(config, matrix, combos)
    session.baseline_doc("cpu")  # the CPU file is read first, as when CPU combinations run first
    record = next(iter(document("cuda", [cuda.id])["combinations"].values()))
    session.staged[cuda.id] = record
    config.stash[plugin._STATE] = session
    plugin.pytest_sessionfinish(SimpleNamespace(config=config), 0)
    written = json.loads(baselines.path_for(tmp_path, platform.detect("cuda").id).read_text())
    assert set(written["combinations"]) == {cuda.id}
    assert written["platform"]["device"] == "cuda"
    cpu_doc = json.loads(baselines.path_for(tmp_path, platform.detect("cpu").id).read_text())
    assert set(cpu_doc["combinations"]) == {cpu.id}
    # the update's lock names the folder it guards, so it is swept once this temporary folder is gone
    lock = baselines.lock_for(baselines.path_for(tmp_path, platform.detect("cuda").id))
    assert lock.read_text().split("\n")[1] == str(tmp_path.resolve())


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory):
    matrix = registry.load_matrix(write_local_matrix(tmp_path_factory.mktemp("tiny")))
    combo = next(c for c in combinations(matrix) if c.pair == "tiny+draft")
    settings = PerfSettings.from_matrix(matrix, rounds=2, max_rounds=2)
    runner = Runner(combo, load_pair(combo), settings)
    runner.round()
    runner.round()
    return runner


@pytest.mark.parametrize("edit, named", [
    (lambda b: b.update(max_new_tokens=b["max_new_tokens"] * 2), "max_new_tokens"),
    (lambda b: b.update(prompt_ids=["other/0"]), "prompt_ids"),
    (lambda b: b.update(k=b["k"] + 1), "k "),
    (lambda b: b["decode"].update(schedule="heuristic"), "schedule"),
    (lambda b: b["decode"].update(min_new_tokens=0), "min_new_tokens"),
    (lambda b: b["decode"].update(fused_draft=True), "fused_draft"),
    (lambda b: b["decode"].update(lookup_first=3), "lookup_first"),
    (lambda b: b["decode"].update(confidence_threshold=0.7), "confidence_threshold"),
])
def test_a_baseline_of_other_work_is_refused(tiny_runner, edit, named):
    baseline = tiny_runner.baseline_record(None)
    check_comparable(tiny_runner, baseline)  # its own record: comparable
    edit(baseline)
    with pytest.raises(BaselineMismatchError, match=f"measured with other settings .*{named}.*--perf-update-baselines"):
        check_comparable(tiny_runner, baseline)


def test_older_records_without_decode_settings(tiny_runner):
    before_fused = tiny_runner.baseline_record(None)
    del before_fused["decode"]["fused_draft"], before_fused["decode"]["lookup_first"]
    check_comparable(tiny_runner, before_fused)  # recorded before those settings: it ran without them
    baseline = tiny_runner.baseline_record(None)
    del baseline["decode"]
    check_comparable(tiny_runner, baseline)  # greedy: what they hold is enough
    sampled = copy.copy(tiny_runner)
    sampled.combo = dataclasses.replace(tiny_runner.combo, decoding="sampled")
    baseline["decoding"] = "sampled"
    with pytest.raises(BaselineMismatchError, match="does not record its sampling settings"):
        check_comparable(sampled, baseline)


def test_a_combination_listed_twice_is_a_registry_error(tmp_path):
    path = write_local_matrix(tmp_path)
    text = path.read_text()
    path.write_text(text + '[[perf.combinations]]\npair = "tiny+lookup"\nprecisions = ["fp32"]\n'
                           'platforms = ["cpu"]\ndecoding = ["greedy"]\n')
    with pytest.raises(RegistryError, match="tiny\\+lookup:fp32:cpu:greedy:k.* is listed twice"):
        combinations(registry.load_matrix(path))
    assert issubclass(RegistryError, HarnessError)
    r = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / "perf"), "-p", "no:cacheprovider", "-q",
                        "--perf-matrix", str(path), "--collect-only"], capture_output=True, text=True, cwd=REPO,
                       timeout=300, env={**os.environ, "PYTHONPATH": python_path(REPO)})
    assert r.returncode == 4, r.stdout + r.stderr
    assert "--perf-matrix:" in r.stderr and "is listed twice" in r.stderr and "Traceback" not in r.stderr


def test_an_update_on_a_new_platform_names_the_nearest_known_one(tmp_path):
    matrix = registry.load_matrix()
    combos = combinations(matrix)
    cpu = next(c for c in combos if c.device == "cpu")
    other = document("cpu", [cpu.id])
    cls = "generic" if platform.detect("cpu").capability != "generic" else "avx2"  # another class than ours
    other["platform"].update(capability=cls, id=platform.platform_id(
        "cpu", other["platform"]["cpu_model"], None, cls, other["platform"]["cpu_count"]))
    baselines.write(baselines.path_for(tmp_path, other["platform"]["id"]), other)
    config = fake_config(tmp_path, perf_update_baselines=True)
    session = plugin.PerfSession(config, matrix, combos)
    measured = copy.deepcopy(other["combinations"][cpu.id])
    measured["plain_tokens_per_sec"]["median"] *= 1.5
    session.staged[cpu.id] = measured
    config.stash[plugin._STATE] = session
    plugin.pytest_sessionfinish(SimpleNamespace(config=config), 0)
    ours = platform.detect("cpu")
    assert (f"{ours.id}.json is a new platform; nearest known platform: {other['platform']['id']}.json (same device "
            f"(cpu), other capability class ({cls} there, {ours.capability} here)") in "\n".join(session.update_lines)
    assert any(line.startswith(f"    ~ {cpu.id}: plain_tokens_per_sec") and "(+50.0%)" in line
               for line in session.update_lines)


@pytest.mark.alone
def test_a_host_far_from_the_baselines_host_is_deferred_not_passed(tmp_path):
    """The stored probe says the baseline's host was twice as fast: the combination is DEFERRED, a
    pytest skip with the reason, in results.json and the summary, and not counted as gated."""
    matrix = registry.load_matrix()
    combos = combinations(matrix)
    cpu = next(c for c in combos if c.device == "cpu")
    doc = document("cpu", [cpu.id])
    probe = hostspeed.measure()
    doc["combinations"][cpu.id]["host_probe"] = {**probe, "rates": {m: 2 * v for m, v in probe["rates"].items()}}
    baselines.write(baselines.path_for(tmp_path, platform.detect("cpu").id), doc)
    session = plugin.PerfSession(fake_config(tmp_path), matrix, combos)
    with pytest.raises(pytest.skip.Exception, match=f"{re.escape(cpu.id)}: DEFERRED: this host's probe is .*% slower"):
        gates.run_gate(session, cpu, request=None)  # deferred before any model is loaded
    assert session.loaded is None
    result = session.results[-1]
    assert result.verdict == "deferred" and result.host["comparable"] is False
    assert session.counts() == {"gated": 0, "regressed": 0, "undecided": 0, "skipped": 0, "deferred": 1}
    assert any("not comparable: the stored gate defers to the A/B gate (`make perf-ab`)" in n for n in session.notes)
    perf_report.write_all(session.results, tmp_path / "reports", provenance.collect())  # validated by the schema
    row = perf_report.summary_lines(session.results)[2]
    assert "DEFERRED" in row and "than the baseline's host: gate it A/B (make perf-ab)" in row
    assert json.loads((tmp_path / "reports" / "results.json").read_text())["results"][0]["verdict"] == "deferred"


def test_a_round_counts_the_page_faults_its_runs_took_and_none_where_the_system_counts_none(tmp_path, monkeypatch):
    """Round.page_faults: the generating thread's count after the round's runs less the count before
    them (harness/core/timing.py); None where there is no per-thread count."""
    from harness.core import timing

    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    combo = next(c for c in combinations(matrix) if c.pair == "tiny+draft")
    runner = Runner(combo, load_pair(combo), PerfSettings.from_matrix(matrix, rounds=2, max_rounds=2))
    counts = iter([1000, 1015])
    monkeypatch.setattr(timing, "thread_page_faults", lambda: next(counts))
    assert runner.round().page_faults == 15
    monkeypatch.setattr(timing, "thread_page_faults", lambda: None)
    assert runner.round().page_faults is None


def test_a_round_waits_between_its_runs_where_asked_and_times_the_runs_only(tmp_path):
    """Side by side with --perf-duet-sync on the worker waits for the other arm after every run of a
    round but the last (harness/perf/ab/worker.py): each prompt in each mode is one run. Its
    tokens/s time the runs, not the waits."""
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    combo = next(c for c in combinations(matrix) if c.pair == "tiny+draft")
    runner = Runner(combo, load_pair(combo), PerfSettings.from_matrix(matrix, rounds=2, max_rounds=2))
    runner.warmup()
    calls: list[tuple[int, int]] = []

    def between(runs: int, of: int) -> None:
        calls.append((runs, of))
        time.sleep(0.3)

    waited = runner.round(between)
    total = 2 * len(runner.prompts)  # plain and assisted, each prompt
    assert calls == [(k, total) for k in range(1, total)]
    assert waited.wall_s >= 0.3 * len(calls)  # the round's wall time holds the waits
    # 0.3 s of waiting a run, against runs of milliseconds: had it been timed, tokens/s would fall 10x
    assert waited.plain_tokens_per_sec * 10 > runner.round().plain_tokens_per_sec


def test_the_warm_up_runs_the_assisted_mode_on_every_prompt_at_full_length_twice(tmp_path, monkeypatch):
    """Its verification passes take up to K+1 tokens, each count a shape of its own: the first
    measured round must not be the first to see them. Plain runs once, briefly. The whole warm-up
    runs twice: the allocator's heap grows over a process's first runs, and the first round must not
    pay for the pages it touches for the first time (docs/gate-studies.md, "The first round of a worker")."""
    matrix = registry.load_matrix(write_local_matrix(tmp_path))
    combo = next(c for c in combinations(matrix) if c.pair == "tiny+draft")
    runner = Runner(combo, load_pair(combo), PerfSettings.from_matrix(matrix, prompts=3))
    ran: list[tuple[str, Any, int]] = []
    real = runner._run

    def recorded(mode, ids, settings):
        ran.append((mode, ids, settings.max_new_tokens))
        return real(mode, ids, settings)

    monkeypatch.setattr(runner, "_run", recorded)
    runner.warmup()
    full = runner.decode.max_new_tokens
    assert len(runner.inputs) == 3 and full > interleave.WARMUP_TOKENS
    once = [(PLAIN, runner.inputs[0], interleave.WARMUP_TOKENS)] + [(combo.mode, ids, full) for ids in runner.inputs]
    assert ran == once + once
