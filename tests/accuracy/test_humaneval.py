"""HumanEval pass@1 of the default pair, plain and assisted (greedy), in the sandbox, against
baselines/accuracy.json. Where assisted and plain tokens are equal the verdicts must be equal;
plain and assisted pass@1 must each stay within the baseline's tolerance of their baseline, and
assisted within it of plain (bf16 near-ties change some completions). CI runs a fixed subset at the
precisions this machine's CPU class chooses (what a user of the pair gets here; a bf16 target has
no fast kernel on some classes and would cost CI minutes there, docs/ci.md); the full 164 are
`slow`, at the pair's default precisions (`make accuracy-all`, about 1.6 h here). The CI subset also
checks the pair's fastest preset for the class, assisted, against plain bf16's subset baseline; where
the preset is the class's own choice its run is the assisted arm's, not generated twice.

Code runs in the sandbox (harness/sandbox/execute.py); the test allows code execution for its own
evaluation only (allow=True), as `--allow-code-execution` does for the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from harness.accuracy import baselines as accuracy_baselines
from harness.accuracy import humaneval
from harness.workload.selection import Request
from accuracy_common import humaneval_rows, matrix, save, skip_if_model_missing

pytestmark = [pytest.mark.accuracy, pytest.mark.real]

PAIR, TP, DP = "qwen-coder-1.5b+0.5b", "bf16", "w8af32-tensor"


@dataclass(frozen=True)
class AssistedArm:
    """What a run's assisted arm generated and how it scored, with what it ran."""

    config: humaneval.GenerateConfig
    task_ids: tuple[str, ...]
    generated: Any
    evaluated: Any


def run(tmp_path, selection: str, target_precision: str | None = None,
        draft_precision: str | None = None) -> AssistedArm:
    """Plain and assisted at the given precisions; None: the CPU class's choice (the registry's)."""
    m = matrix()
    chosen = humaneval.build_generate_config(
        m, Request(pair=PAIR, target_precision=target_precision, draft_precision=draft_precision),
        assisted=True).selection
    tp, dp = chosen.target.precision, chosen.draft.precision
    name = accuracy_baselines.key(PAIR, tp, dp, selection)
    base = accuracy_baselines.entry(name)
    if base is None:
        message = (f"no baseline {name!r} in {accuracy_baselines.PATH}: measure it (make humaneval-full for the "
                   "full set) and add it with harness.accuracy.baselines.write_entry")
        pytest.skip(message) if selection == "full" else pytest.fail(message)
    out = {}
    for assisted in (False, True):
        request = Request(pair=PAIR, target_precision=target_precision,
                          draft_precision=draft_precision if assisted else None, max_new_tokens=base["max_new_tokens"])
        config = humaneval.build_generate_config(m, request, assisted=assisted)
        with skip_if_model_missing():
            gen = humaneval.generate(config, tmp_path / f"{'assisted' if assisted else 'plain'}.jsonl",
                                     task_ids=base["task_ids"], progress=False)
        ev = humaneval.evaluate(gen.out, allow=True, workers=2)
        out["assisted" if assisted else "plain"] = (config, gen, ev)
    (_, pg, pe), (config, ag, ae) = out["plain"], out["assisted"]
    lines = []
    for prow, arow in zip(pe.rows, ae.rows):
        # the completion is the text up to the first stop sequence: assisted decoding may run a few
        # tokens past it (it stops after a verification step), so compare completions, not raw tokens
        same = prow["completion"] == arow["completion"]
        lines.append(f"{prow['task_id']}: plain {prow['result'][:50]!r} assisted {arow['result'][:50]!r} "
                     f"completions {'equal' if same else 'DIFFER'}")
        if same:
            assert prow["passed"] == arow["passed"], lines[-1]
    summary = (f"{name}: pass@1 plain {pe.pass_at[1]:.3f} ({pg.tokens_per_sec or 0:.2f} tokens/s), assisted "
               f"{ae.pass_at[1]:.3f} ({ag.tokens_per_sec or 0:.2f} tokens/s); baseline {base['plain_pass_at_1']:.3f} / "
               f"{base['assisted_pass_at_1']:.3f} +- {base['tolerance']}")
    print("\n" + "\n".join(lines + [summary]))
    save(f"humaneval-{selection}", {"name": name, "plain_pass_at_1": pe.pass_at[1], "assisted_pass_at_1": ae.pass_at[1],
                                    "plain_tokens_per_sec": pg.tokens_per_sec, "assisted_tokens_per_sec": ag.tokens_per_sec,
                                    "rows": humaneval_rows(pe.rows, ae.rows)})
    assert abs(pe.pass_at[1] - base["plain_pass_at_1"]) <= base["tolerance"] + 1e-9, summary
    assert abs(ae.pass_at[1] - base["assisted_pass_at_1"]) <= base["tolerance"] + 1e-9, summary
    # where completions differ (bf16 near-ties), assisted may solve a different set: the same tolerance
    assert abs(ae.pass_at[1] - pe.pass_at[1]) <= base["tolerance"] + 1e-9, summary
    return AssistedArm(config, tuple(base["task_ids"]), ag, ae)


def same_run(a: humaneval.GenerateConfig, b: humaneval.GenerateConfig) -> bool:
    """Whether two assisted configurations generate alike: every value of the selection but the
    reference arm's precision, which HumanEval never runs."""
    def values(c: humaneval.GenerateConfig) -> dict[str, Any]:
        return {**c.selection.as_values(), "reference_precision": None, "mode": c.mode}

    return values(a) == values(b)


def check_fastest_preset(tmp_path, chosen: AssistedArm) -> None:
    """The pair's fastest preset for this CPU class (bench --preset fastest), assisted, on the CI
    subset: its pass@1 beside plain bf16's (the subset baseline), within the same tolerance. Where the
    preset is the class's own choice (AVX2), the class choice's assisted arm is that run."""
    m = matrix()
    if m.cpu_class not in m.pair(PAIR).presets.get("fastest", {}):
        print(f"\n{PAIR} has no fastest preset for CPU class {m.cpu_class}: its check does not apply here")
        return
    base = accuracy_baselines.entry(accuracy_baselines.key(PAIR, TP, DP, "subset"))
    assert base is not None, "the subset baseline is missing from baselines/accuracy.json"
    config = humaneval.build_generate_config(
        m, Request(pair=PAIR, preset="fastest", max_new_tokens=base["max_new_tokens"]), assisted=True)
    sel = config.selection
    if same_run(config, chosen.config) and tuple(base["task_ids"]) == chosen.task_ids:
        gen, ev, source = chosen.generated, chosen.evaluated, "the class's choice: its assisted arm above"
    else:
        with skip_if_model_missing():
            gen = humaneval.generate(config, tmp_path / "preset.jsonl", task_ids=base["task_ids"], progress=False)
        ev, source = humaneval.evaluate(gen.out, allow=True, workers=2), "generated"
    summary = (f"{PAIR} preset fastest ({sel.precisions}, K={sel.k}, class {m.cpu_class}; {source}): pass@1 "
               f"{ev.pass_at[1]:.3f} at {gen.tokens_per_sec or 0:.2f} tokens/s; plain bf16 baseline "
               f"{base['plain_pass_at_1']:.3f} +- {base['tolerance']}")
    print("\n" + "\n".join(f"{r['task_id']}: {r['result'][:60]!r}" for r in ev.rows) + "\n" + summary)
    save("humaneval-subset-fastest", {"preset": sel.precisions, "k": sel.k,
                                      "cpu_class": m.cpu_class, "pass_at_1": ev.pass_at[1],
                                      "plain_bf16_baseline": base["plain_pass_at_1"],
                                      "tokens_per_sec": gen.tokens_per_sec})
    assert abs(ev.pass_at[1] - base["plain_pass_at_1"]) <= base["tolerance"] + 1e-9, summary


def test_humaneval_subset(tmp_path):
    """The subset at the class's choice, plain and assisted; then the fastest preset's check."""
    check_fastest_preset(tmp_path, run(tmp_path, "subset"))


@pytest.mark.slow
def test_humaneval_full(tmp_path):
    run(tmp_path, "full", TP, DP)
