"""benchmarks/suspect_rule.py: the glue it plants moves what 5 ms more per assisted step moves, and
asking a suspect for more evidence ends unchanged gates no later and names planted glue no more often."""

from __future__ import annotations

import dataclasses

import pytest

from bench_scripts import script_module


@pytest.fixture(scope="module")
def rule():
    with script_module("ab_power"), script_module("gate_power_table"), script_module("suspect_rule") as module:
        yield module


def phases(overhead: float, draft: float, verify: float, steps: int = 10) -> dict:
    return {"overhead": {"calls": steps, "total_ms": overhead * steps}, "draft_step": {"calls": 6 * steps, "total_ms": draft * steps},
            "verify": {"calls": steps, "total_ms": verify * steps}}


def test_glue_moves_the_overhead_and_the_assisted_step_by_its_ms(rule):
    pool = [{"phases": {"base": [phases(50.0, 300.0, 150.0)] * 3 + [None]}}]
    shift = rule.glue_shift(pool, 5.0)
    assert shift["overhead"] == pytest.approx(50 / 55)
    assert shift["assisted_tokens_per_sec"] == shift["speedup"] == pytest.approx(500 / 505)
    assert shift["plain_tokens_per_sec"] == shift["draft_step"] == shift["verify"] == shift["target_step"] == 1.0


def test_more_evidence_ends_unchanged_gates_sooner_and_names_glue_less_often(rule):
    """On the kept avx2 A/A gates under the noisy neighbour (deterministic: the draws are seeded)."""
    table = rule.table
    kept = table.Kept.of(table.load_rows([table.DATA / "ab_power_avx2_duet-swap0.05-standin_noisy_k16-fused-c0.6.jsonl"]),
                         table.default_looks())
    group = next(g for g in kept.groups if g.tolerance == 0.10 and table.AA in kept.groups[g])
    pool = table.aa_pool(kept.rows, group, kept.default_looks)
    combo, settings, ab = table.replay_setup(group)
    glue = rule.glue_shift(pool, 5.0)
    unchanged = {m: 1.0 for m in glue}

    def at(z: float, shift: dict) -> dict:
        return rule.gates(pool, shift, (combo, settings, dataclasses.replace(ab, suspect_z=z)), 100)
    assert at(2.5, unchanged)["rounds"] < at(0.0, unchanged)["rounds"]
    assert at(2.5, glue)["overhead"] < at(0.0, glue)["overhead"]


def test_a_bad_rule_is_named(rule, capsys):
    with pytest.raises(SystemExit):
        rule.parse_args(["--z", "1,two"])
    assert "--z '1,two'" in capsys.readouterr().err
