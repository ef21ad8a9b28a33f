"""The A/B gate's decisions on real recorded rounds (harness/perf/replay.py), in process and
deterministic: gates of the default pair measured side by side on an AMD EPYC (Zen 4) VM
(benchmarks/data/), replayed through the gate's own code, decide as they did live."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import random
import re
import statistics
from pathlib import Path

import pytest
from bench_scripts import script_module

from harness.machine import capability
from harness.workload import registry
from harness.perf.ab import duet
from harness.perf.ab.gate import ABGate, ABSettings
from harness.perf.ab.loadguard import LoadGuard
from harness.perf.combinations import PerfSettings
from harness.perf.outcome import Outcome
from harness.perf.record import METRICS, Round
from harness.perf.replay import RecordedArm, ReplayError, ab_gate, power_row_rounds

DATA_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
DATA = DATA_DIR / "ab_power_avx512-bf16_duet_quiet.jsonl"
# the quiet gates, and those whose rounds kept their phases (decided on them too)
GATES = [json.loads(line) for path in (DATA, DATA_DIR / "ab_power_avx512-bf16_duet_quiet_phases.jsonl")
         for line in path.read_text().splitlines()]


def arm_rounds(gate: dict, arm: str) -> list[Round]:
    return power_row_rounds(gate, arm)


def combo_of(gate: dict):
    """The recorded gate's combination, as much of it as a replay reads."""
    return type("Combo", (), {"id": gate["combination"], "decoding": "greedy"})()


def replayed(gate: dict, candidate: list[Round] | None = None, **ab):
    settings = PerfSettings.from_matrix(registry.load_matrix())
    combo = combo_of(gate)
    rounds = candidate or arm_rounds(gate, "candidate")
    return ab_gate(combo, settings, ABSettings(**ab), RecordedArm("base", "HEAD 0123456789ab", arm_rounds(gate, "base")),
                   RecordedArm("candidate", "working-tree 0123456789ab", rounds))


@pytest.mark.parametrize("gate", GATES, ids=[f"{g.get('into', 'target')}{g['level']:.0%}-tol{g.get('tolerance', 0.1):.0%}-{i}" for i, g in enumerate(GATES)])
def test_recorded_gates_decide_again_as_they_did_live(gate):
    result = replayed(gate, tolerance=gate.get("tolerance", ABSettings().tolerance)).run()  # at its own settings
    assert result.outcome.value == gate["outcome"]
    assert {m: d.verdict.value for m, d in result.decisions.items()} == gate["verdicts"]
    for m in METRICS:
        assert result.ratios[m] == pytest.approx(gate["ratios"][m])


class LoggedArm(RecordedArm):
    """A recorded arm that writes each load request sent and each answer read into a shared log."""

    def __init__(self, events: list[str], *args):
        super().__init__(*args)
        self.events = events

    def send(self, message):
        if message["op"] == "load":
            self.events.append(f"send {self.name}")
        super().send(message)

    def receive(self, op, *, timeout_s=None):
        if op == "load":
            self.events.append(f"read {self.name}")
        return super().receive(op, timeout_s=timeout_s)


@pytest.mark.parametrize("plan", [duet.IN_TURN, duet.plan("on", [0, 1])], ids=["in-turn", "duet"])
def test_both_arms_load_at_once_whether_or_not_their_rounds_take_turns(plan):
    """Nothing is timed while the arms load and warm up, so each worker gets its load request before
    either answer is awaited: loading in turn doubled a GPU gate's time (docs/bench.md)."""
    gate, events = GATES[0], []
    settings = PerfSettings.from_matrix(registry.load_matrix())
    combo = combo_of(gate)
    arms = [LoggedArm(events, name, f"HEAD {name}", arm_rounds(gate, name)) for name in ("base", "candidate")]
    ABGate(combo, settings, *arms, lambda arm: {"op": "load"}, ABSettings(restart_every=4),
           guard=LoadGuard(watch=False), plan=plan, available=8).run()
    assert events == ["send base", "send candidate", "read base", "read candidate"] * 2  # the start and one restart


def test_a_slowdown_planted_into_recorded_a_a_rounds_is_caught_and_a_smaller_one_is_not():
    aa = next(g for g in GATES if g["level"] == 0)

    def slowed(fraction: float) -> list[Round]:
        return [Round(plain_tokens_per_sec=r.plain_tokens_per_sec / (1 + fraction),
                      assisted_tokens_per_sec=r.assisted_tokens_per_sec / (1 + fraction), speedup=r.speedup,
                      counters={}) for r in arm_rounds(aa, "candidate")]
    assert replayed(aa, slowed(0.10)).run().outcome == Outcome.REGRESSION
    assert replayed(aa, slowed(0.01)).run().outcome == Outcome.PASS


def test_a_recording_shorter_than_the_first_look_is_decided_at_its_end_and_one_that_runs_dry_is_an_error():
    aa = next(g for g in GATES if g["level"] == 0)
    short = arm_rounds(aa, "candidate")[:3]
    result = replayed(aa, short).run()
    assert result.rounds == 3 and result.outcome in (Outcome.UNDECIDED, Outcome.PASS)
    assert result.cut_short and any("recording ends after 3 rounds" in n for n in result.notes)
    assert not replayed(aa, arm_rounds(aa, "candidate")).run().cut_short  # decided within its recording
    same = replayed(aa, arm_rounds(aa, "base")[:3]).run()  # settled at its 3 rounds, but no live gate looks there
    assert same.outcome == Outcome.PASS and same.cut_short
    gate = replayed(aa, short)
    gate.cap = 4  # more rounds asked than the candidate's recording holds
    with pytest.raises(ReplayError, match="the recording has no round 4"):
        gate.run()


def test_resampled_gates_decide_on_the_phases_as_live_gates_do():
    """benchmarks/ab_power.py's resampled gates carry the phases: a shift of `draft_step` alone (tokens/s
    untouched) is caught, and unshifted A/A rounds raise no alarm; a shift that says nothing of the
    phases leaves them out (the gate decides on the metrics alone)."""
    aa = [g for g in GATES if g["level"] == 0 and g.get("phases")]
    settings = PerfSettings.from_matrix(registry.load_matrix())
    combo = combo_of(aa[0])
    with script_module("ab_power") as ab_power:
        unchanged = ab_power.shifts([], ("target", 0.0))
        draft = {**unchanged, "draft_step": 1 / 1.15}

        def rates(shift):
            return ab_power.simulate(aa, shift, combo, settings, ABSettings(), 40, random.Random(7))

        assert rates(draft)["regression"] >= 0.9
        assert rates(unchanged)["regression"] == 0.0
        assert rates({m: draft[m] for m in METRICS})["regression"] == 0.0  # tokens/s alone did not move
        batch4 = dataclasses.replace(settings, batch=4)
        kept = {**aa[0], "looks": ab_power.looks_of(batch4)}  # a gate run with --batch 4
        assert not ab_power.same_looks(kept, settings) and ab_power.same_looks(kept, batch4)
        assert ab_power.same_looks(aa[0], settings)  # kept before rows named their looks
        # 8 rounds of 15 s (the slower arm's) and one redone: 135 s of 4.25 minutes, 60 s each of two starts
        timed = {"rounds": 8, "restart_every": 4, "redone": 1, "minutes": 4.25,
                 "wall_s": {"base": [15.0] * 8, "candidate": [14.0, 15.0] * 4}}
        assert ab_power.time_split([timed, {"rounds": 8, "minutes": 9.0}]) == pytest.approx((15.0, 60.0))
        nominal = ab_power.shifts([], ("target", 0.10))
        assert nominal["verify"] == nominal["target_step"] == pytest.approx(1 / 1.1) and nominal["draft_step"] == 1.0
        assert nominal["verify_cpu"] == nominal["target_step_cpu"] == pytest.approx(1 / 1.1)
        # a level's gates recorded before the passes in CPU time: those move as their wall clocks did
        older = [{"into": "verify", "level": 0.1, "ratios": {**{m: [1.0, 1.0] for m in METRICS},
                                                              "verify": [0.9, 0.9], "draft_step": [1.0, 1.0]}}]
        measured = ab_power.shifts(older, ("verify", 0.1))
        assert measured["verify_cpu"] == measured["verify"] == pytest.approx(0.9) and measured["draft_step_cpu"] == 1.0
        assert "overhead_cpu" not in measured and "target_step_cpu" not in measured  # nothing says how they moved


def test_the_report_says_when_too_few_worker_pairs_back_the_resampled_rates(capsys):
    """A resampled rate from a few worker pairs is said to be rough; from enough of them it is not."""
    aa = [g for g in GATES if g["level"] == 0 and g["rounds"] == 8]
    settings = PerfSettings.from_matrix(registry.load_matrix())
    args = type("Args", (), {"tolerance": 0.1, "restart_every": 4, "condition": "quiet", "trials": 2, "cpu": None})()
    plan = type("Plan", (), {"mode": "duet"})()
    with script_module("ab_power") as ab_power:
        assert ab_power.worker_pairs([{"rounds": 8, "restart_every": 4}, {"rounds": 13}], 4) == 2 + 4
        few, enough = aa[:2], aa * (-(-ab_power.MIN_PAIRS // (2 * len(aa))))
        assert ab_power.worker_pairs(few, 4) < ab_power.MIN_PAIRS <= ab_power.worker_pairs(enough, 4)
        for pool in (few, enough):
            ab_power.report(pool, pool, [("target", 0.0)], combo_of(aa[0]), settings, plan, args)
    few_out, enough_out = capsys.readouterr().out.split("A/B gate power")[1:]
    assert "(4 worker pairs)" in few_out and "only 4 worker pairs to resample from" in few_out
    assert "worker pairs to resample from" not in enough_out


def test_the_noise_study_takes_a_core_offset_out_of_the_spread_and_reads_the_kept_rows():
    """benchmarks/noise_sources.py: a planted offset between the two cores is all of a gate's spread
    as gated and none of it with the core term; on the kept rows both lines are printed."""
    with script_module("noise_sources") as noise:
        cores = [0, 1] * 8
        d = [0.04 * (1 if c == 0 else -1) + 0.002 * ((i * 7) % 5 - 2) for i, c in enumerate(cores)]
        assert statistics.stdev(d) > 0.035 and noise.core_term_sd(d, cores) < 0.004
        lines = noise.summary([g for g in GATES if not g["level"]])
        # four worker pairs 3% apart and a 1% spread within each: the offsets are between, not within
        rounds = [math.exp(0.03 * (pair % 2) + 0.01 * (1 if i % 2 else -1)) for pair in range(4) for i in range(4)]
        within, between = noise.pair_spread([{"ratios": {"speedup": rounds}, "restart_every": 4}], "speedup")
        # a first round that spreads +-5% after each start, the others +-1%: the place shows it
        first = [math.exp((0.05 if i % 4 == 0 else 0.01) * (1 if (i // 4) % 2 else -1)) for i in range(16)]
        places = noise.place_spread([{"ratios": {"speedup": first}, "restart_every": 4}], "speedup")
    assert places == pytest.approx([0.0577, 0.0115, 0.0115, 0.0115], abs=0.0005)
    assert "by place in a worker pair" in lines[2]
    assert lines[0].startswith(f"{sum(1 for g in GATES if not g['level'])} A/A gates") and "with a core term" in lines[0]
    assert "between worker pairs" in lines[1] and "predicted from the phase medians" in lines[3]
    assert within == pytest.approx(0.0115, abs=0.001) and between == pytest.approx(0.0163, abs=0.0005)


def test_the_noise_study_counts_one_off_spikes_of_host_work_by_place_and_commit():
    """benchmarks/noise_sources.py host_spikes(): a round whose host work stands 30 ms above its arm's
    median is counted at its place in the worker pair (the row's own restart_every), under the
    candidate's commit, with its size; 20 ms is not, nor an arm without the phase in every round, nor
    a gate without phases or a commit."""
    def gate(commit, extra_ms, at, every=4, rounds=8, faults=None):
        spiked = [{"overhead_cpu": {"total_ms": 60.0 + (extra_ms if i in at else 0.0)}} for i in range(rounds)]
        row = {"trees": {"candidate": {"commit": commit}}, "restart_every": every,
               "phases": {"base": spiked, "candidate": [{"overhead_cpu": {"total_ms": 61.0}}] * rounds}}
        return row if faults is None else {**row, "page_faults": faults}
    older = {"trees": {"candidate": {"commit": "ccccccc3"}}, "restart_every": 4,
             "phases": {"base": [{"verify": {"total_ms": 1.0}}] * 4, "candidate": [None, *[{"overhead_cpu": {"total_ms": 1.0}}] * 3]}}
    with script_module("noise_sources") as noise:
        counts = noise.host_spikes([gate("aaaaaaa1", 30.0, {0, 4}), gate("aaaaaaa1", 30.0, {5}),
                                    gate("bbbbbbb2", 20.0, {0, 4}), gate("ddddddd4", 40.0, {0, 2, 3}, every=2),
                                    older, {"level": 0, "phases": {}},
                                    {"phases": {"base": [{"overhead_cpu": {"total_ms": 1.0}}] * 2}}])
        line = noise.spikes_line("aaaaaaa", counts["aaaaaaa"])
        # where the rows kept each round's page faults: the rounds over 100 by place, and the spikes among them
        faulted = noise.host_spikes([gate("eeeeeee5", 30.0, {0, 4}, faults={"base": [1261, 0, 0, 0, 5, 0, 0, 0],
                                                                            "candidate": [0, 0, 0, 0, 0, 0, 0, 2523]}),
                                     gate("eeeeeee5", 30.0, {1}, rounds=4, faults={"base": [0, 0, 0, None]})])["eeeeeee"]
        wide = noise.spikes_line("ddddddd", noise.Spikes(30.0, ((3, 8),), (26.0, 40.0, 90.0)))
    assert counts["aaaaaaa"].places == ((2, 8), (1, 8), (0, 8), (0, 8)) and counts["aaaaaaa"].sizes_ms == (30.0,) * 3
    assert counts["bbbbbbb"].places == ((0, 4),) * 4 and counts["bbbbbbb"].sizes_ms == ()
    assert counts["aaaaaaa"].faulted == () and "page faults" not in line  # rows from before the counts
    assert faulted.places == ((2, 6), (1, 6), (0, 6), (0, 6)) and (faulted.spikes_faulted, faulted.spikes_counted) == (1, 2)
    assert faulted.faulted == ((1, 4), (0, 4), (0, 4), (1, 4))  # the second gate's base lacks a count: left out
    assert noise.spikes_line("eeeeeee", faulted).endswith(
        "rounds with over 100 page faults by place: 1/4, 0/4, 0/4, 1/4, 1 of the 2 spikes whose rounds counted page faults were among them")
    assert counts["ddddddd"].places == ((2, 8), (1, 8)) and "ccccccc" not in counts
    assert line.endswith("2/8, 1/8, 0/8, 0/8; above the median round by 30 ms (10th-90th percentile 30-30, all 30-30)")
    # few spikes: the percentiles stay within the spikes (the default method extrapolates past them)
    assert "over 30 ms" in wide and wide.endswith("by 40 ms (10th-90th percentile 29-80, all 26-90)")


def test_a_power_row_keeps_when_the_gate_finished_and_each_arms_commit_and_replays_as_kept():
    """benchmarks/ab_power.py's row of a gate (here one replaying a kept row's rounds): its outcome,
    rounds and each arm's metrics as the gate saw them, the UTC time it finished and the code each arm
    ran and the host's CPU, so that a file's rows are a history of the gate on its host."""
    from datetime import datetime, timedelta, timezone

    from harness.perf.ab.revision import Tree

    kept = next(g for g in GATES if g["level"] and g.get("phases"))

    class Replaying(ABGate):
        """The gate ab_power.py starts, with the kept rounds in place of the workers it was given."""

        def __init__(self, combo, settings, base, candidate, load_request, ab, guard, plan):
            for arm in (base, candidate):
                arm.discard_log()  # never started
            super().__init__(combo, settings, *(RecordedArm(arm.name, f"{arm.tree.label} {arm.tree.commit}",
                                                            power_row_rounds(kept, arm.name)) for arm in (base, candidate)),
                             lambda arm: {"op": "load"}, ab, guard=LoadGuard(watch=False), plan=plan,
                             available=kept["rounds"])

    trees = (Tree(Path("."), "a" * 40, "HEAD"), Tree(Path("."), "b" * 40, "working tree (uncommitted changes)"))
    matrix = registry.load_matrix()
    with script_module("ab_power") as ab_power:
        row = ab_power.run_gate(matrix, combo_of(kept), PerfSettings.from_matrix(matrix), trees, kept["level"],
                                kept.get("tolerance", 0.1), seed=0, plan=duet.IN_TURN, restart_every=4, noise=(),
                                into=kept.get("into", "target"), gate_class=Replaying)
    row = json.loads(json.dumps(row))  # as the file keeps it
    assert (row["outcome"], row["rounds"], row["verdicts"]) == (kept["outcome"], kept["rounds"], kept["verdicts"])
    assert all(row["arms"][arm][m] == pytest.approx(values) for arm, kept_arm in kept["arms"].items()
               for m, values in kept_arm.items()) and row["phases"] == kept["phases"]
    assert row["trees"] == {"base": {"commit": "a" * 40, "label": "HEAD"},
                            "candidate": {"commit": "b" * 40, "label": "working tree (uncommitted changes)"}}
    finished = datetime.fromisoformat(row["finished"])
    assert finished.utcoffset() == timedelta(0) and abs(datetime.now(timezone.utc) - finished) < timedelta(minutes=1)
    # the host of the class, to its generation where the model name covers several
    assert row["cpu"] == {"model": capability.cpuinfo()[0], "generation": capability.cpu_generation()}
    if platform.machine() in ("x86_64", "AMD64"):
        assert re.fullmatch(r"family \d+ model \d+", row["cpu"]["generation"]), row["cpu"]
