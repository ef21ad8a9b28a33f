"""benchmarks/gate_power_table.py: docs/perf-gate.md's gate-power table is the one the kept gates
make, and each row is judged against the issues' targets as they are written."""

from __future__ import annotations

import dataclasses

import pytest

from bench_scripts import script_module


@pytest.fixture(scope="module")
def gpt():
    with script_module("ab_power"), script_module("gate_power_table") as module:  # it imports ab_power
        yield module


def gate(outcome: str = "pass", minutes: float = 3.0, rounds: int = 8, into: str = "target", level: float = 0.0,
         verdicts: dict | None = None) -> dict:
    return {"combination": "p+d:bf16:cpu:greedy:k6", "outcome": outcome, "minutes": minutes, "rounds": rounds,
            "into": into, "level": level, "verdicts": verdicts or {}}


def group(gpt, tolerance: float = 0.10):
    return gpt.Group("ab_power_x.jsonl", "amx", "quiet", "duet", "p+d:bf16:cpu:greedy:k6", tolerance, (8, 8, 32))


def test_the_doc_holds_the_table_the_data_make(gpt):
    doc = gpt.DOC.read_text(encoding="utf-8")
    assert gpt.BEGIN in doc and gpt.END in doc, f"{gpt.DOC}: the gate-power table's markers are gone"
    written = doc[doc.index(gpt.BEGIN) + len(gpt.BEGIN):doc.index(gpt.END)].strip("\n")
    made = gpt.render(gpt.load_rows(sorted(gpt.DATA.glob("ab_power_*.jsonl"))), gpt.load_resampled(gpt.RESAMPLED),
                      gpt.default_looks())
    assert written == made, ("docs/perf-gate.md's gate-power table is not the one benchmarks/data makes: "
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
    assert gpt.outcomes([named, other], verify) == "2 REGRESSION (1 naming `verify`)"
    old = gate("regression", into="draft", level=0.20)  # a row from before per-phase verdicts
    assert gpt.caught(old, ("draft", 0.20)) and gpt.outcomes([old], ("draft", 0.20)) == "1 REGRESSION"


def test_a_resampled_rate_of_other_rounds_is_not_shown(gpt):
    pool = [gate(rounds=8), gate(rounds=16)]
    kept = {group(gpt).key: {"aa_rounds": 24, "pairs": 6, "trials": 2000, "regression": 0.001, "undecided": 0.0,
                             "rounds": 9.5}}
    assert gpt.resampled_cell(group(gpt), pool, kept).startswith("0.1%, 0.0%, 9.5 (2000 gates; rough: 24 A/A rounds")
    assert "not resampled" in gpt.resampled_cell(group(gpt), pool + [gate()], kept)


def test_a_doc_without_markers_is_named(gpt, tmp_path):
    with pytest.raises(SystemExit, match="perf-gate.md: the markers"):
        gpt.replace_between_markers("no table here", "| table |", tmp_path / "perf-gate.md")
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
    assert [gpt.stopped_sooner(r, setup) for r in named] == [False] * len(named)
    assert [gpt.stopped_sooner(r, setup) for r in unnamed] == [True] * len(unnamed)
    cell = gpt.outcomes(rows, ("draft", 0.10), earlier_rule=len(unnamed))
    assert cell.startswith(f"{len(rows)} REGRESSION ({len(named)} naming `draft_step`); {len(unnamed)} stopped by an earlier rule")
    table = gpt.render(gpt.load_rows([gpt.DATA / "ab_power_avx512-bf16_duet-swap0.05_quiet_k16-fused-c0.6.jsonl"]), {},
                       gpt.default_looks())
    row = next(line for line in table.splitlines() if "| draft 10% (plain untouched) |" in line)
    assert f"{len(unnamed)} stopped by an earlier rule" in row, row


def test_a_level_measured_again_in_its_own_file_is_judged_and_resumed_there(gpt):
    """The quiet draft-10% level at the 0.05 s exchange was measured again under today's stopping
    rule into `..._phase-located.jsonl`: the older file's row stays as measured, without a target,
    and its command no longer adds gates of that level."""
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
    command = next(line for line in table.splitlines() if f"--out benchmarks/data/{base}" in line and "--tolerance" not in line)
    levels = command.split("--levels ")[1].split()[0].split(",")
    assert "draft:0.1" not in levels and "draft:0.2" in levels, command


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
