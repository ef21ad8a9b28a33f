"""benchmarks/gate_power_table.py: docs/gate-power.md's table is the one the kept gates
make, and each row is judged against the issues' targets as they are written."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench_scripts import script_module


@pytest.fixture(scope="module")
def gpt():
    with script_module("ab_power"), script_module("gate_power_table") as module:  # it imports ab_power
        yield module


@pytest.fixture(scope="module")
def kept_table(gpt) -> str:
    """The tables every kept file makes (made once: it replays each judged gate)."""
    return gpt.render(gpt.load_rows(sorted(gpt.DATA.glob("ab_power_*.jsonl"))), gpt.load_resampled(gpt.RESAMPLED),
                      gpt.default_looks())


def gate(outcome: str = "pass", minutes: float = 3.0, rounds: int = 8, into: str = "target", level: float = 0.0,
         verdicts: dict | None = None) -> dict:
    return {"combination": "p+d:bf16:cpu:greedy:k6", "outcome": outcome, "minutes": minutes, "rounds": rounds,
            "into": into, "level": level, "verdicts": verdicts or {}}


def group(gpt, tolerance: float = 0.10):
    return gpt.Group("ab_power_x.jsonl", "amx", "quiet", "duet", "p+d:bf16:cpu:greedy:k6", tolerance, (8, 8, 32))


def test_the_doc_holds_the_table_the_data_make(gpt, kept_table):
    doc = gpt.DOC.read_text(encoding="utf-8")
    assert gpt.BEGIN in doc and gpt.END in doc, f"{gpt.DOC}: the gate-power table's markers are gone"
    written = doc[doc.index(gpt.BEGIN) + len(gpt.BEGIN):doc.index(gpt.END)].strip("\n")
    assert written == kept_table, ("docs/gate-power.md's table is not the one benchmarks/data makes: "
                             "run python benchmarks/gate_power_table.py --resample --write")


def test_unchanged_code_meets_the_target_only_with_20_gates_and_no_false_alarm(gpt):
    aa = ("target", 0.0)
    rates = {"regression": 0.004, "pairs": 20}
    assert gpt.target(group(gpt), aa, [gate()] * 20, rates) == "met"
    assert gpt.target(group(gpt), aa, [gate()] * 20) == "20 gates; resampled rates from 20 worker pairs to come"
    assert gpt.target(group(gpt), aa, [gate()] * 20, {"regression": 0.02, "pairs": 20}) == \
        "missed: 2.0% of resampled gates a false alarm"
    rough = {"regression": 0.20, "pairs": 12}  # too few pairs to judge by
    assert gpt.target(group(gpt), aa, [gate()] * 5, rough) == "5 of 20 so far"
    assert gpt.target(group(gpt), aa, [gate()] * 5) == "5 of 20 so far"
    assert gpt.target(group(gpt), aa, [gate()] * 4 + [gate("regression")]) == "missed: 1 false alarm"
    assert gpt.target(group(gpt), aa, [gate(minutes=6.0)] * 20, rates) == "missed: 6.0 min a gate (target 5)"
    assert gpt.target(group(gpt, 0.05), aa, [gate(minutes=9.0)] * 20, rates) == "met"  # no minutes target at 5%


def test_a_planted_level_needs_19_of_20_caught(gpt):
    ten = ("target", 0.10)
    caught, missed = gate("regression", level=0.10), gate("undecided", level=0.10)
    assert gpt.target(group(gpt), ten, [caught] * 19 + [missed]) == "met"
    assert gpt.target(group(gpt), ten, [caught] * 18 + [missed] * 2) == "missed: 18 of 20 caught"
    assert gpt.target(group(gpt), ten, [caught] * 3 + [missed]) == "4 of 20 so far"
    assert gpt.target(group(gpt), ten, [caught] * 2 + [missed] * 2) == "missed: 2 of 4 caught"  # 19 out of reach
    five = ("target", 0.05)
    assert gpt.target(group(gpt, 0.05), five, [gate("regression", minutes=9.5, level=0.05)] * 20) == "met"
    assert gpt.target(group(gpt, 0.05), five, [gate("regression", minutes=11.0, level=0.05)] * 20).startswith("missed")


def test_a_phase_level_counts_only_gates_that_name_the_phase(gpt):
    verify = ("verify", 0.10)
    named = gate("regression", into="verify", level=0.10, verdicts={"verify": "regression"})
    other = gate("regression", into="verify", level=0.10, verdicts={"verify": "inconclusive"})
    assert gpt.target(group(gpt), verify, [named] * 20) == "met"
    assert gpt.target(group(gpt), verify, [named] * 18 + [other] * 2) == "missed: 18 of 20 caught"
    assert gpt.outcomes([named, other], verify) == "2 REGRESSION (1 naming `verify` or `verify_cpu`)"
    in_cpu_time = gate("regression", into="verify", level=0.10, verdicts={"verify": "inconclusive", "verify_cpu": "regression"})
    assert gpt.target(group(gpt), verify, [in_cpu_time] * 20) == "met"  # the phase in CPU time names it too
    old = gate("regression", into="draft", level=0.20)  # a row from before per-phase verdicts
    assert gpt.caught(old, ("draft", 0.20)) and gpt.outcomes([old], ("draft", 0.20)) == "1 REGRESSION"


def test_a_resampled_rate_of_other_rounds_is_not_shown(gpt):
    pool = [gate(rounds=8), gate(rounds=16)]
    kept = {group(gpt).key: {"aa_rounds": 24, "rule": gpt.STOPPING_RULE, "pairs": 6, "trials": 2000,
                             "regression": 0.001, "undecided": 0.0, "rounds": 9.5}}
    assert gpt.resampled_cell(group(gpt), pool, kept).startswith("0.1%, 0.0%, 9.5 (2000 gates; rough: 24 A/A rounds")
    assert "not resampled" in gpt.resampled_cell(group(gpt), pool + [gate()], kept)
    earlier = {k: {**v, "rule": "an earlier stopping rule"} for k, v in kept.items()}  # made by other gate code
    assert "not resampled" in gpt.resampled_cell(group(gpt), pool, earlier)


def test_a_target_judges_what_todays_gate_decides_on_the_recorded_rounds(gpt):
    """A caught gate that today's gate code, replayed on its rounds, passes at an earlier look counts
    as the PASS it is today; one that an earlier rule stopped (today's gate would look again) keeps
    its recorded call."""
    ten = ("target", 0.10)
    caught = gate("regression", level=0.10, rounds=16)
    passes_sooner = gpt.Replayed(8, "pass", {}, False)
    later = gpt.Replayed(16, "regression", {}, True)
    assert gpt.as_today(caught, passes_sooner)["outcome"] == "pass"
    assert gpt.as_today(caught, later) is caught and gpt.as_today(caught, None) is caught
    gates = [gpt.as_today(caught, t) for t in [passes_sooner] * 2 + [later] * 18]
    assert gpt.target(group(gpt), ten, gates) == "missed: 18 of 20 caught"


def test_a_doc_without_markers_is_named(gpt, tmp_path):
    with pytest.raises(SystemExit, match="gate-power.md: the markers"):
        gpt.replace_between_markers("no table here", "| table |", tmp_path / "gate-power.md")
    text = f"before\n{gpt.BEGIN}\nold\n{gpt.END}\nafter"
    assert gpt.replace_between_markers(text, "new", tmp_path) == f"before\n{gpt.BEGIN}\nnew\n{gpt.END}\nafter"


def test_a_gate_an_earlier_rule_stopped_where_todays_gate_looks_again_is_named_as_such(gpt):
    """The kept quiet draft-10% gates at the 0.05 s exchange: those that stopped at the first look
    on the speedup while draft_step was still a suspect would have gone on under today's gate; those
    that named draft_step there would not."""
    rows = [row for file, row in gpt.load_rows([gpt.DATA / "ab_power_avx512-bf16_duet-swap0.05_quiet_k16-fused-c0.6.jsonl"])
            if row.get("into") == "draft" and row["level"] == 0.10 and row["rounds"] == 8]
    named = [r for r in rows if r["verdicts"]["draft_step"] == "regression"]
    unnamed = [r for r in rows if r["verdicts"]["draft_step"] != "regression"]
    assert named and unnamed
    setup = gpt.replay_setup(gpt.group_of("f.jsonl", rows[0], gpt.default_looks()))
    today = [gpt.replayed(r, setup) for r in rows]
    assert [t.cut_short for r, t in zip(rows, today) if r in named] == [False] * len(named)
    assert [t.cut_short for r, t in zip(rows, today) if r in unnamed] == [True] * len(unnamed)
    cell = gpt.outcomes(rows, ("draft", 0.10), today)
    assert cell.startswith(f"{len(rows)} REGRESSION ({len(named)} naming `draft_step` or `draft_step_cpu`); "
                           f"{len(unnamed)} stopped by an earlier rule")
    table = gpt.render(gpt.load_rows([gpt.DATA / "ab_power_avx512-bf16_duet-swap0.05_quiet_k16-fused-c0.6.jsonl"]), {},
                       gpt.default_looks())
    row = next(line for line in table.splitlines() if "| draft 10% (plain untouched) |" in line)
    assert f"{len(unnamed)} stopped by an earlier rule" in row, row


def test_a_gate_todays_rule_ends_sooner_on_the_same_rounds_says_where(gpt):
    """Gates recorded under today's rule replay to where they stopped; where a later rule stops
    sooner on the same rounds, the row says where and with what outcome."""
    name = "ab_power_avx2_duet-swap0.05-standin_noisy_k16-fused-c0.6.jsonl"
    rows = [row for _, row in gpt.load_rows([gpt.DATA / name]) if row["tolerance"] == 0.05 and row["level"] == 0]
    setup = gpt.replay_setup(gpt.group_of(name, rows[0], gpt.default_looks()))
    today = [gpt.replayed(r, setup) for r in rows]
    assert [(t.rounds, t.outcome, t.cut_short) for t in today] == [(r["rounds"], r["outcome"], False) for r in rows]
    assert gpt.outcomes(rows, gpt.AA, today) == f"{len(rows)} PASS"
    recorded = [gate(rounds=24), gate(rounds=32), gate(rounds=8)]
    sooner = [gpt.Replayed(16, "pass", {}, False), gpt.Replayed(8, "pass", {}, False), gpt.Replayed(8, "pass", {}, False)]
    assert gpt.outcomes(recorded, gpt.AA, sooner) == "3 PASS; 2 today's gate ends sooner on the same rounds (PASS at 8 x1, PASS at 16 x1)"


def test_a_level_measured_again_in_its_own_file_is_judged_and_resumed_there(gpt):
    """The quiet draft-10% level at the 0.05 s exchange was measured again under today's stopping
    rule into `..._phase-located.jsonl`: the older file's row stays as measured, without a target, and
    the level is judged there; neither file had the stand-in, so their levels are measured again in
    today's setup, into its own file, by one command."""
    base = "ab_power_avx512-bf16_duet-swap0.05_quiet_k16-fused-c0.6.jsonl"
    again = base.removesuffix(".jsonl") + "_phase-located.jsonl"
    rows = gpt.load_rows([gpt.DATA / base, gpt.DATA / again])
    groups = gpt.grouped(rows, gpt.default_looks())
    old = next(g for g in groups if g.file == base and g.tolerance == 0.10)
    assert gpt.measured_again(old, ("draft", 0.10), groups).file == again
    assert gpt.measured_again(old, ("target", 0.10), groups) is None
    table = gpt.render(rows, {}, gpt.default_looks())
    draft = [line for line in table.splitlines() if "| draft 10% (plain untouched) |" in line]
    old_row = next(line for line in draft if line.endswith(f"| {gpt.short(base)} |"))
    assert f"| measured again: {gpt.short(again)} |" in old_row, old_row
    # both files are of the setup before the stand-in: one command measures their levels in today's, each once
    assert not any(f"--out benchmarks/data/{name}" in line for line in table.splitlines() for name in (base, again))
    today = gpt.todays_file(old)
    assert today == "ab_power_avx512-bf16_duet-swap0.05-standin_quiet_k16-fused-c0.6.jsonl"
    assert gpt.resumed(old) == gpt.todays(old) and gpt.todays(old).file == today and gpt.todays_setup(gpt.todays(old))
    assert gpt.resumed(gpt.todays(old)) == gpt.todays(old)  # today's setup takes gates where it is
    assert gpt.todays_file(old, env=True) == today.replace("_quiet_", "_quiet_env_")
    env = dataclasses.replace(old, file=gpt.todays_file(old, env=True))
    assert gpt.todays_file(env) == env.file and gpt.todays_file(env, env=False) == today
    command = next(line for line in table.splitlines() if f"--out benchmarks/data/{today}" in line and "--tolerance" not in line)
    levels = command.split("--levels ")[1].split()[0].split(",")
    assert levels.count("draft:0.1") == 1 and "draft:0.2" in levels and len(set(levels)) == len(levels), command
    assert gpt.todays_file(dataclasses.replace(old, file=again)) == today


def test_only_a_phase_located_file_of_the_same_setup_measures_a_level_again(gpt):
    x = group(gpt)
    def groups(*others):
        return {x: {("draft", 0.10): []}, **{g: {("draft", 0.10): []} for g in others}}
    again = dataclasses.replace(x, file="ab_power_x_phase-located.jsonl")
    assert gpt.measured_again(x, ("draft", 0.10), groups(again)) == again
    assert gpt.measured_again(x, ("verify", 0.10), groups(again)) is None  # a level it does not hold
    for sister in ("ab_power_x_phases.jsonl", "ab_power_x_env.jsonl", "ab_power_xphase-located.jsonl",
                   "ab_power_x.jsonl_phase-located"):
        assert gpt.measured_again(x, ("draft", 0.10), groups(dataclasses.replace(x, file=sister))) is None, sister
    for other in (dataclasses.replace(again, tolerance=0.05), dataclasses.replace(again, looks=(8, 8, 16)),
                  dataclasses.replace(again, swap_s=0.05), dataclasses.replace(again, condition="noisy")):
        assert gpt.measured_again(x, ("draft", 0.10), groups(other)) is None, other


def test_a_files_unchanged_levels_come_before_its_planted_ones(gpt):
    levels = [("env", 0.1), ("glue", 0.012), ("target", 0.1), ("env", 0.0), ("draft", 0.2), ("target", 0.0)]
    assert sorted(levels, key=gpt.level_order) == [("target", 0.0), ("env", 0.0), ("target", 0.1), ("draft", 0.2),
                                                   ("glue", 0.012), ("env", 0.1)]


def test_the_glance_table_shows_todays_setup_before_any_earlier_one(gpt):
    """A cell is today's setup's status (default exchange, stand-in) where it has gates; else the closest
    earlier setup's, marked with a letter the legend names; else '-'."""
    ten = next(t for t in gpt.TARGETS if t.title == "target 10%")
    aa = next(t for t in gpt.TARGETS if t.title == "A/A")
    today = dataclasses.replace(group(gpt), swap_s=gpt.duet.SWAP_S, stand_in=True)
    between = dataclasses.replace(group(gpt), swap_s=None)
    no_stand_in = dataclasses.replace(today, stand_in=False)
    assert gpt.todays_setup(today) and not gpt.todays_setup(no_stand_in) and not gpt.todays_setup(between)
    assert not gpt.todays_setup(dataclasses.replace(today, swap_s=0.25))
    assert not gpt.todays_setup(dataclasses.replace(today, mode="interleaved"))
    glue = next(t for t in gpt.TARGETS if t.into == "glue")
    xeon = "Intel Xeon, family 6 model 143"
    on_xeon = dataclasses.replace(today, cpu=xeon)
    cells = {("amx", None, "quiet", ten): [(between, ("target", 0.1), "met"), (today, ("target", 0.1), "13 of 20 so far"),
                                           (no_stand_in, ("target", 0.1), "met")],
             ("amx", None, "quiet", aa): [(between, ("target", 0.0), "missed: 1 false alarm"),
                                          (no_stand_in, ("target", 0.0), "3 of 20 so far")],
             ("amx", None, "quiet", glue): [(today, ("glue", 0.012), "missed: 11 of 13 caught"),
                                            (today, ("glue", 0.014), "5 of 20 so far")],
             ("amx", None, "noisy", aa): [(between, ("target", 0.0), "2 of 20 so far")],
             ("amx", xeon, "quiet", aa): [(on_xeon, ("target", 0.0), "met")]}
    lines = gpt.glance(cells, ["amx", "avx2"])
    header = lines[0].split(" | ")
    quiet = next(line for line in lines if line.startswith("| amx | not recorded | quiet |")).split(" | ")
    noisy = next(line for line in lines if line.startswith("| amx | not recorded | noisy |")).split(" | ")
    assert quiet[header.index("target 10%")] == "13 of 20 so far"
    assert quiet[header.index("A/A")] == "(a) 3 of 20 so far"  # the default exchange before between rounds
    assert noisy[header.index("A/A")] == "(b) 2 of 20 so far"
    assert quiet[header.index("draft 20%")] == "-"
    assert quiet[header.index("glue (5 ms a step)")] == "glue 1.2%: missed: 11 of 13 caught; glue 1.4%: 5 of 20 so far"
    assert not any(line.startswith("| avx2 |") for line in lines)  # a class with no gates has no rows
    # a recorded CPU has rows of its own, before those kept unrecorded, and neither stands in for the other
    cpus = [line.split(" | ")[1] for line in lines if line.startswith("| amx |")]
    assert cpus == [xeon, xeon, "not recorded", "not recorded"], cpus
    on_it = next(line for line in lines if line.startswith(f"| amx | {xeon} | quiet |")).split(" | ")
    assert on_it[header.index("A/A")] == "met" and on_it[header.index("target 10%")] == "-"
    assert lines[-1] == ("Earlier setups: (a) exchange every 0.05 s, no stand-in; "
                         "(b) exchange between rounds, no stand-in.")


def test_a_target_column_holds_only_its_level(gpt):
    five = next(t for t in gpt.TARGETS if t.title == "target 5% at 5%")
    assert five.holds(("target", 0.05), None) and not five.holds(("target", 0.10), 300.0) and five.tolerance == 0.05
    assert not five.holds(("draft", 0.05), None)
    row = {"combination": "p+d:bf16:cpu:greedy:k6", "mode": "duet", "swap_s": 0.05, "tolerance": 0.1}
    assert gpt.group_of("f.jsonl", {**row, "stand_in_rounds": 0}, (8, 8, 32)).stand_in  # tried, could not start
    assert not gpt.group_of("f.jsonl", {**row, "stand_in_rounds": None}, (8, 8, 32)).stand_in
    assert not gpt.group_of("f.jsonl", row, (8, 8, 32)).stand_in  # a row from before the stand-in
    # runs started together (--duet-sync): a setup of its own, asked even where the base could not
    synced = gpt.group_of("f.jsonl", {**row, "stand_in_rounds": 8, "synced_rounds": 0}, (8, 8, 32))
    plain = gpt.group_of("f.jsonl", {**row, "stand_in_rounds": 8, "synced_rounds": None}, (8, 8, 32))
    assert synced.synced and not plain.synced and synced.key != plain.key
    assert gpt.todays_setup(plain) and not gpt.todays_setup(synced)
    assert "--duet-sync" in gpt.command(synced, [gpt.TARGETS[1]], (8, 8, 32))


def test_a_glue_level_holds_the_5_ms_target_only_where_it_plants_5_ms_a_step(gpt):
    """Glue is a fraction of the verification pass (harness/perf/plant.py), so a level holds the 5 ms target
    by the pass time of its own gates; its command asks for the ms, sized on the CPU that runs it."""
    glue = next(t for t in gpt.TARGETS if t.into == "glue")
    assert glue.ms == gpt.GLUE_MS == 5.0 and glue.asked == "glue:5ms" and gpt.TARGETS[4].asked == "verify:0.1"
    assert glue.holds(("glue", 0.014), 357.0)        # 5.0 ms
    assert glue.holds(("glue", 0.012), 420.0)        # 5.04 ms: the same level on a slower pass
    assert not glue.holds(("glue", 0.012), 357.0)    # 4.3 ms
    assert glue.holds(("glue", 0.0134), 357.0) and not glue.holds(("glue", 0.0132), 357.0)  # 95% of 5 ms: 4.75
    assert not glue.holds(("glue", 0.014), None) and not glue.holds(("glue", 0.0), 357.0)
    assert not glue.holds(("verify", 0.014), 357.0)
    assert glue.under(("glue", 0.012), 357.0) and not glue.under(("glue", 0.014), 357.0)  # 4.3 ms; 5.0 ms
    assert not glue.under(("glue", 0.012), None) and not glue.under(("glue", 0.0), 357.0)
    assert not glue.under(("verify", 0.012), 357.0) and not gpt.TARGETS[1].under(("target", 0.05), 357.0)


def test_glue_in_ms_is_sized_on_the_cpu_that_runs_it(gpt):
    """ab_power.py's glue:5ms: the level this CPU's kept gates planted 5 ms a step with (the one with the
    most gates), else the smallest fraction in steps of 0.1% that plants it on this CPU's latest 20
    timed passes; a level that planted less is not resumed; nothing to size by without a timed pass."""
    ab = gpt.ab_power
    five = ab.parse_level("glue:5ms")
    assert five == ab.PerStep("glue", 5.0) and str(five) == "glue:5ms" and ab.parse_level("glue:0.017") == ("glue", 0.017)
    for bad in ("glue:0ms", "glue:-5ms", "glue:ms", "glue:infms", "draft:5ms"):
        with pytest.raises(SystemExit, match="--levels"):
            ab.parse_level(bad)
    assert ab.fraction_planting(5.0, 357.0) == 0.015 and ab.fraction_planting(5.0, 286.0) == 0.018  # at least 5 ms
    assert ab.fraction_planting(5.0, 250.0) == 0.02 and ab.fraction_planting(5.0, 200.0) == 0.025  # no step over
    assert all(ab.plants(("glue", ab.fraction_planting(5.0, ms)), ms, 5.0) for ms in (150.0, 222.2, 286.0, 499.0, 1e3))
    phases = [{"verify": {"median_ms": ms}} for ms in (300.0, 360.0, 340.0)]
    assert ab.verify_ms([{"phases": {"base": phases[:2], "candidate": [{"verify": {"median_ms": 999.0}}] * 2}},
                         {"phases": {"base": [phases[2], None]}}, {}]) == 340.0  # the base arm's rounds
    assert ab.verify_ms([{}, {"phases": None}]) is None
    timed = [{"phases": {"base": [{"verify": {"median_ms": float(ms)}}]}} for ms in range(100, 130)]
    assert ab.latest_pass([*timed, {}]) == 119.5  # the median of the latest 20 that timed a pass

    def gate(level, verify, into="glue"):
        return {"into": into, "level": level, "phases": {"base": [{"verify": {"median_ms": verify}}]}}

    aa = [gate(0.0, 357.0, "target")] * 3
    assert ab.sized_level(five, [], []) is None and ab.sized_level(five, aa[:0], [{}]) is None
    assert ab.sized_level(five, aa, aa) == ("glue", 0.015)                        # sized anew
    assert ab.sized_level(five, [*aa, gate(0.021, 240.0)], aa) == ("glue", 0.021)  # its own: 5.04 ms
    assert ab.sized_level(five, [*aa, gate(0.013, 352.0)], aa) == ("glue", 0.015)  # 4.6 ms: not the target's
    held = [gate(0.014, 352.0)] * 3 + [gate(0.015, 352.0)]
    assert ab.sized_level(five, [*aa, *held], aa) == ("glue", 0.014)  # of two that plant 5 ms, the one with more gates
    assert ab.sized_level(five, [gate(0.02, 300.0, "verify")], [gate(0.02, 300.0, "verify")]) == ("glue", 0.017)
    assert ab.sized_level(ab.PerStep("glue", 2.5), aa, aa) == ("glue", 0.008)


def test_ab_power_sizes_glue_in_ms_from_this_cpus_gates_and_says_so(gpt, tmp_path, monkeypatch, capsys):
    """ab_power.py --levels glue:5ms in a file where this CPU's gates timed a 300 ms pass: 1.7% (5.1 ms),
    said on stderr; another CPU's gates there size nothing here: a report says the level is not sized
    yet, and a run of gates stops before any gate with a line naming --levels."""
    from harness.perf.ab.loadguard import NOISE_ENV

    ab = gpt.ab_power
    here, other = {"model": "Test CPU", "generation": "family 1 model 2"}, {"model": "Other CPU", "generation": "x"}
    monkeypatch.setattr(ab, "host_cpu", lambda: here)
    monkeypatch.delenv(NOISE_ENV, raising=False)
    pair = "qwen-coder-1.5b+0.5b"
    matrix = ab.registry.load_matrix()
    combo = ab.combination(matrix, pair, ab.PerfSettings.from_matrix(matrix))

    def row(cpu, verify):
        return {"combination": combo.id, "mode": "interleaved", "condition": "quiet", "cpu_class": matrix.cpu_class,
                "cpu": cpu, "into": "verify", "level": 0.1, "tolerance": 0.1, "outcome": "regression", "rounds": 8,
                "minutes": 3.0, "phases": {"base": [{"verify": {"median_ms": verify}}]},
                "ratios": {m: [0.95] for m in ab.METRICS}}

    out = tmp_path / "gates.jsonl"

    def run(*rows, levels="verify:0.1,glue:5ms", gates=0):
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return ab.main(["--pair", pair, "--duet", "off", "--levels", levels, "--gates", str(gates), "--trials", "1",
                        "--out", str(out)])

    assert run(row(here, 300.0), row(other, 200.0)) == 0
    err = capsys.readouterr().err
    assert "glue:5ms: glue 1.7% of the verification pass on Test CPU, family 1 model 2 (5.1 ms a step)" in err, err
    assert run(row(other, 200.0)) == 0
    assert "glue:5ms: not sized on Test CPU, family 1 model 2 yet" in capsys.readouterr().err
    monkeypatch.setattr(ab.revision, "checkout", lambda *a, **k: None)  # no gate runs: it stops first
    monkeypatch.setattr(ab.revision, "working_tree", lambda *a, **k: None)
    with pytest.raises(SystemExit, match="--levels glue:5ms: no gate of this setup on Test CPU, family 1 model 2 in "):
        run(row(other, 200.0), levels="glue:5ms,verify:0.1", gates=1)


def test_one_glue_command_plants_5_ms_on_each_cpu_of_the_kept_data(gpt, kept_table):
    """On the kept files: amx's 1.2% glue with the stand-in (a faster pass) planted under 5 ms and missed,
    so it is kept without a target and out of the glance; the 1.4% one holds the target. Every command
    asks for glue:5ms: in avx512-bf16's file of today's setup the Zen 5 VM resumes its level, which
    planted 5 ms there, and the Zen 4 VM (a slower pass) sizes a smaller one of its own."""
    table = kept_table.splitlines()
    standin = "amx_duet-swap0.05-standin_quiet_k16-fused-c0.6"
    row = next(line for line in table if line.endswith(f"| {standin} |") and "| glue 1.2% (4." in line)
    assert "| no target: under 5 ms a step; missed: 11 of 13 caught |" in row, row
    header = table[2].split(" | ")
    quiet = next(line for line in table if line.startswith("| amx | not recorded | quiet |")).split(" | ")
    assert "1.2%" not in quiet[header.index("glue (5 ms a step)")]
    commands = [line.strip() for line in table if line.startswith("    python") or line.startswith("    " + gpt.NOISY)]
    glue = {lv for c in commands for lv in c.split("--levels ")[1].split()[0].split(",") if lv.startswith("glue:")}
    assert glue == {"glue:5ms"}, glue
    today = "ab_power_avx512-bf16_duet-swap0.05-standin_quiet_k16-fused-c0.6.jsonl"
    kept = [row for _, row in gpt.load_rows([gpt.DATA / today]) if row.get("tolerance", 0.10) == 0.10]
    zen5, zen4 = ([g for g in kept if gpt.ab_power.host_of(g) == f"AMD EPYC, family {f}"] for f in ("26 model 2", "25 model 17"))
    five = gpt.ab_power.parse_level("glue:5ms")
    assert gpt.ab_power.sized_level(five, zen5, zen5) == ("glue", 0.021)
    own = gpt.ab_power.sized_level(five, zen4, zen4)
    assert own[1] < 0.021 and gpt.ab_power.plants(own, gpt.ab_power.latest_pass(zen4), 5.0), own


def test_a_glue_level_under_5_ms_holds_the_target_only_by_meeting_it(gpt, monkeypatch):
    """An earlier setup's glue gates send the glue target to today's file; a level there that planted a
    little less than 5 ms (a faster host) stands for the target while it may still meet it and once it
    has met it, and is kept without a target once it misses; two sizes in the glance are each named,
    unless one meets the target and none missed it. A glue level at a tolerance the issues set no glue
    target for (5%) is not called under-sized. Each command asks for glue:5ms."""
    monkeypatch.setattr(gpt, "replayed", lambda row, setup: gpt.Replayed(row["rounds"], row["outcome"], row["verdicts"], False))
    pair = "qwen-coder-1.5b+0.5b"
    combo = gpt.todays_combinations([pair])["amx", pair]

    def row(level, verify, stand_in, tolerance=0.1):
        return {"combination": combo, "cpu_class": "amx", "condition": "quiet", "mode": "duet", "swap_s": 0.05,
                "stand_in_rounds": 8 if stand_in else None, "tolerance": tolerance, "outcome": "regression",
                "rounds": 8, "minutes": 3.0, "into": "glue", "level": level, "verdicts": {"overhead": "regression"},
                "phases": {"base": [{"verify": {"median_ms": verify}}] * 8}}

    today, old = "ab_power_amx_duet-swap0.05-standin_quiet_x.jsonl", "ab_power_amx_duet-swap0.05_quiet_x.jsonl"
    rows = [(today, row(0.014, 352.0, True)), (old, row(0.012, 455.0, False)), (today, row(0.01, 352.0, True, 0.05))]

    def render(rows):
        table = gpt.render(rows, {}, gpt.default_looks()).splitlines()
        command = next(line for line in table if f"--out benchmarks/data/{today}" in line and "--tolerance" not in line)
        glance = next(line for line in table if line.startswith("| amx | not recorded | quiet |")).split(" | ")
        row = next((line for line in table if "| 10% | glue 1.3% (4.6 ms a step) |" in line), "")
        return command.split(" --levels ")[1].split()[0], glance[table[2].split(" | ").index("glue (5 ms a step)")], row, table

    levels, glance, _, table = render(rows)
    assert levels == "0,0.1,draft:0.2,draft:0.1,verify:0.1,glue:5ms" and glance == "1 of 20 so far", (levels, glance)
    assert not any(f"--out benchmarks/data/{old}" in line for line in table)  # no stand-in: its levels go to today's
    at_5 = next(line for line in table if "| 5% | glue 1% (3.5 ms a step) |" in line)
    assert at_5.split(" | ")[10] == "-", at_5
    rows[0] = (today, row(0.013, 352.0, True))  # 4.6 ms: under-sized, but it may still meet the target
    assert render(rows)[:2] == ("0,0.1,draft:0.2,draft:0.1,verify:0.1,glue:5ms", "1 of 20 so far")
    missed = dict(row(0.013, 352.0, True), outcome="pass")
    levels, glance, line, _ = render([*rows, (today, missed)] + [(today, missed)])  # 1 of 3 caught: no target
    assert (levels, glance) == ("0,0.1,draft:0.2,draft:0.1,verify:0.1,glue:5ms", "(a) 1 of 20 so far")  # the old file's
    assert "| no target: under 5 ms a step; missed: 1 of 3 caught |" in line, line
    levels, glance, line, _ = render([*rows] * 20 + [(today, row(0.015, 352.0, True))])  # met at 4.6 ms
    assert glance == "met at 4.6 ms a step", line
    sized_missed = dict(row(0.015, 352.0, True), outcome="pass")  # 5.3 ms, missed: the smaller one stands for nothing
    levels, glance, line, _ = render([*rows] * 20 + [(today, sized_missed)] * 2)
    assert glance == "glue 1.5%: missed: 0 of 2 caught; glue 1.3%: met at 4.6 ms a step", glance


def test_targets_without_gates_get_a_command_in_todays_setup(gpt, kept_table):
    """A target no kept gate holds for a class and condition gets its level in today's setup's file
    (quiet and under the noisy neighbour alike): amx has no gates at 5% and no noisy phase or
    environment gates; environment levels go to the `_env` sister file."""
    table = kept_table.splitlines()
    header = table[2].split(" | ")

    def command(out, *having):
        lines = [line.strip() for line in table if line.strip().startswith(("python", gpt.NOISY)) and out in line
                 and all(h in line for h in having)]
        assert len(lines) == 1, (out, having, lines)
        return lines[0]

    for condition in ("quiet", "noisy"):
        line = next(line for line in table if line.startswith(f"| amx | not recorded | {condition} |")).split(" | ")
        assert line[header.index("A/A at 5%")] == "-"
        out = f"--out benchmarks/data/ab_power_amx_duet-swap0.05-standin_{condition}_k16-fused-c0.6.jsonl"
        at_5 = command(out, "--tolerance 0.05")
        assert "--levels 0,0.05 " in at_5 and at_5.startswith(gpt.NOISY if condition == "noisy" else "python"), at_5
    noisy = next(line for line in table if line.startswith("| amx | not recorded | noisy |")).split(" | ")
    assert noisy[header.index("verify 10%")] == "-" and noisy[header.index("glue (5 ms a step)")] == "-"
    out = "--out benchmarks/data/ab_power_amx_duet-swap0.05-standin_noisy_k16-fused-c0.6.jsonl"
    levels = command(out, "draft:0.1").split("--levels ")[1].split()[0].split(",")
    assert levels[:5] == ["0", "0.1", "draft:0.2", "draft:0.1", "verify:0.1"] and levels[5].startswith("glue:"), levels
    env = command("ab_power_amx_duet-swap0.05-standin_noisy_env_k16-fused-c0.6.jsonl")
    assert "--levels env:0,env:0.1 " in env and "--gates 10 " in env and env.startswith(gpt.NOISY), env
    env = command("avx2_duet-swap0.05-standin_quiet_env_k16-fused-c0.6.jsonl")
    assert "--levels env:0,env:0.1 " in env and env.startswith("python"), env


def test_each_glance_cell_is_the_target_of_its_row_in_the_kept_data(gpt, kept_table):
    """On the kept files: a glance cell is the target column of the row of today's setup where there is
    one (amx, quiet), else of the closest earlier setup's row at the target's tolerance, never a row
    measured again elsewhere or of another tolerance."""
    table = kept_table.splitlines()
    header = table[2].split(" | ")
    rows = [line.split(" | ") for line in table if line.startswith("| ") and len(line.split(" | ")) == 13]

    def glance(cpu_class, condition, title, host="not recorded"):
        line = next(line for line in table if line.startswith(f"| {cpu_class} | {host} | {condition} |"))
        return line.split(" | ")[header.index(title)]

    def target(file, tolerance, level, cpu="not recorded"):
        row = next(r for r in rows if r[-1] == f"{file} |" and r[1] == cpu and r[4] == tolerance and r[5] == level)
        return row[10]

    standin, earlier = "amx_duet-swap0.05-standin_quiet_k16-fused-c0.6", "amx_duet-swap0.05_quiet_k16-fused-c0.6"
    assert glance("amx", "quiet", "A/A") == target(standin, "10%", "A/A")
    assert glance("amx", "quiet", "draft 10%") == target(standin, "10%", "draft 10% (plain untouched)")
    assert glance("amx", "quiet", "two environments") == "(a) " + target(earlier.replace("_quiet", "_quiet_env"), "10%",
                                                                          "two environments, unchanged")
    bf16 = "avx512-bf16_duet-swap0.05_quiet_k16-fused-c0.6"
    assert target(bf16, "10%", "draft 10% (plain untouched)").startswith("measured again")
    assert glance("avx512-bf16", "quiet", "draft 10%").endswith(
        target(bf16 + "_phase-located", "10%", "draft 10% (plain untouched)"))
    zen5 = "AMD EPYC, family 26 model 2"  # the -standin files' gates, each recording its CPU; the others' are a Zen 4's
    standin = bf16.replace("0.05_", "0.05-standin_")
    assert glance("avx512-bf16", "quiet", "A/A at 5%", zen5) == target(standin, "5%", "A/A", zen5)
    assert glance("avx512-bf16", "quiet", "A/A", zen5) == target(standin, "10%", "A/A", zen5)
    zen4 = "AMD EPYC, family 25 model 17"  # the same file, its own rows
    assert glance("avx512-bf16", "quiet", "A/A", zen4) == target(standin, "10%", "A/A", zen4)
    assert glance("avx512-bf16", "quiet", "A/A at 5%", zen4) == target(standin, "5%", "A/A", zen4) \
        != target(standin, "5%", "A/A", zen5)  # its own rows (10 of 20 so far), not the Zen 5's (met)
    assert glance("avx512-bf16", "quiet", "A/A").endswith(target(bf16, "10%", "A/A"))
    assert glance("avx512-bf16", "quiet", "A/A at 5%") == "(a) " + target(bf16, "5%", "A/A")  # the Zen 4's, not the Zen 5's


def test_the_stopping_rule_names_the_code_that_decides(gpt):
    """Rates resampled under one stopping rule are stale under another (gpt.fresh): so the code that
    decides and stops (docstrings aside) must not change without the rule's name."""
    import ast
    import hashlib
    import inspect

    from harness.measure import phases
    from harness.perf.ab import gate, paired
    from harness.perf.record import GATED_PHASES
    # the phases it decides on, each by its statistic, and which one is which one's CPU time (`suspects`)
    parts = [repr(sorted(GATED_PHASES.items())), repr(sorted(phases.CPU_TIME_OF.items()))]
    for fn in (gate.suspect, gate.suspects, gate._settled, gate.standing, gate.gating, paired.decide):
        node = ast.parse(inspect.getsource(fn)).body[0]
        if ast.get_docstring(node):
            node.body = node.body[1:]
        parts.append(ast.dump(node, annotate_fields=False))
    code = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    assert (gpt.STOPPING_RULE, code) == (
        "2026-12-05b: a tokens/s regression waits while a phase is a suspect (its estimate beyond T/2), a wall-clock "
        "phase not where its CPU time is compared; every phase gated in CPU time too", "2078c1b78d224650"), \
        ("the gate's deciding code changed: give harness/perf/ab/gate.py STOPPING_RULE a new name, set both here, and run "
         "python benchmarks/gate_power_table.py --resample --write")


def test_a_level_measured_before_a_phase_was_gated_still_moves_rounds_that_lack_it(gpt):
    """ab_power.moved: a shift that does not say how `overhead_cpu` moved (a level's gates from
    before it was gated) moves the phases of rounds that lack it too; rounds that carry it lose their
    phases rather than keep one unmoved."""
    from harness.measure.phases import PhaseCost
    from harness.perf.record import Round
    cost = PhaseCost(10, 100.0, 10.0, 9.0)
    old = Round(10.0, 20.0, 2.0, {}, phases={p: cost for p in ("target_step", "verify", "draft_step", "overhead")})
    new = Round(10.0, 20.0, 2.0, {}, phases={**old.phases, "overhead_cpu": cost})
    shift = {"speedup": 1.0, "assisted_tokens_per_sec": 0.9, "plain_tokens_per_sec": 1.0, "target_step": 1.0,
             "verify": 1.0, "draft_step": 0.5, "overhead": 1.0}
    moved = gpt.ab_power.moved(old, shift)
    assert moved.phases["draft_step"].total_ms == 200.0 and moved.assisted_tokens_per_sec == 18.0
    assert gpt.ab_power.moved(new, shift).phases is None
    assert gpt.ab_power.moved(new, {**shift, "overhead_cpu": 1.0}).phases["draft_step"].median_ms == 20.0
