"""Per-phase costs (harness/measure/phases.py): every forward pass timed and filed under its phase,
the decode phase's wall time split into passes and host overhead, acceptance by drafted position;
on tiny random models and on hand-made passes whose answer is known."""

from __future__ import annotations

import dataclasses
import math

import pytest

from harness.measure import phases
from harness.measure.generate import measure_generation
from harness.measure.phases import Call, PhaseCost
from harness.perf.record import RecordError, Round, worker_round
from harness.perf.plant import PlantedSlowdown
from harness.workload.decode import DecodeSettings
from tiny_models import perturbed, prompt, tiny_model

pytestmark = pytest.mark.alone  # planted slowdowns, timed phase by phase

K = 4
SETTINGS = DecodeSettings(max_new_tokens=40)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


def test_quantile_and_a_phase_cost_of_its_calls():
    assert phases.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert phases.quantile([5.0], 0.1) == 5.0
    assert phases.quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    cost = PhaseCost.of([1.0, 2.0, 3.0, 10.0])
    assert (cost.calls, cost.total_ms, cost.median_ms) == (4, 16.0, 2.5)
    assert cost.low_ms == pytest.approx(1.3)
    assert PhaseCost.from_dict(cost.as_dict()) == cost
    with pytest.raises(ValueError):
        phases.quantile([], 0.5)


def test_passes_are_filed_by_model_order_and_width():
    """An assisted generation by hand: draft prefill and its first tokens before the target's
    first pass (the prefill phase), then steps of 2 draft passes and one 3-token verification."""
    calls = [Call("draft", 10, 0.0, 0.010), Call("draft", 1, 0.010, 0.002), Call("draft", 1, 0.012, 0.002),
             Call("target", 13, 0.014, 0.100)]  # decode starts at 0.114
    t = 0.120
    for _ in range(3):  # each step: 6 ms of draft passes, 30 ms of verification, 4 ms of host work
        calls += [Call("draft", 2, t, 0.003), Call("draft", 1, t + 0.003, 0.003), Call("target", 3, t + 0.006, 0.030)]
        t += 0.040
    split = phases.split(calls, decode_start=0.114, decode_end=t)
    assert set(split) == {"prefill", "draft_prefill", "draft_step", "verify", "overhead"}
    assert split["prefill"].calls == 1 and split["prefill"].median_ms == pytest.approx(100.0)
    assert split["draft_prefill"].total_ms == pytest.approx(10.0)
    assert split["draft_step"].calls == 6 and split["draft_step"].median_ms == pytest.approx(3.0)
    assert split["verify"].calls == 3 and split["verify"].median_ms == pytest.approx(30.0)
    # the decode phase: 6 ms before the first step, then 4 ms of host work in each of 3 steps
    assert split["overhead"].calls == 3 and split["overhead"].total_ms == pytest.approx(6.0 + 3 * 4.0)
    # per step, from one verification's end to the next's: 6 (with the 6 ms before the first), 4,
    # and 4 + the 4 ms after the last verification
    assert split["overhead"].median_ms == pytest.approx(6.0) and split["overhead"].low_ms == pytest.approx(4.4)
    acc = phases.accounting(split, decode_tokens=9, measured_ms=(t - 0.114) * 1000)
    assert acc.passes_ms == pytest.approx(6 * 3.0 + 3 * 30.0)
    assert acc.passes_ms + acc.overhead_ms == pytest.approx(acc.measured_ms)
    assert acc.predicted_per_token_ms == pytest.approx(108.0 / 9)
    assert acc.error == pytest.approx(108.0 / 126.0 - 1)
    plain = phases.split([Call("target", 12, 0.0, 0.1), Call("target", 1, 0.1, 0.02)], 0.1, 0.13)
    assert set(plain) == {"prefill", "target_step", "overhead"}
    assert plain["overhead"].total_ms == pytest.approx(10.0)


def test_a_step_interrupted_by_a_burst_moves_the_overheads_mean_and_not_its_median():
    """Plain steps of 20 ms passes and 2 ms of host work; a neighbour takes the core for 200 ms
    between two passes of one step: the mean moves by 200 ms / steps, the median and the 10th
    percentile stay."""
    def steps(burst_at: int | None) -> dict[str, phases.PhaseCost]:
        calls, t = [Call("target", 12, 0.0, 0.1)], 0.1
        for i in range(20):
            t += 0.002 + (0.2 if i == burst_at else 0.0)
            calls.append(Call("target", 1, t, 0.02))
            t += 0.02
        return phases.split(calls, decode_start=0.1, decode_end=t)
    quiet, burst = steps(None)["overhead"], steps(7)["overhead"]
    assert quiet.calls == burst.calls == 20
    assert burst.total_ms - quiet.total_ms == pytest.approx(200.0)
    assert burst.median_ms == pytest.approx(quiet.median_ms) == pytest.approx(2.0)
    assert burst.low_ms == pytest.approx(quiet.low_ms) == pytest.approx(2.0)


def test_the_cpu_overhead_leaves_out_a_burst_in_which_the_thread_did_not_run():
    """Plain steps of 20 ms passes and 2 ms of host work, on both clocks; a neighbour takes the core
    for 200 ms between two passes of one step: the wall-clock overhead has it, the CPU one does not."""
    calls, t, cpu = [Call("target", 12, 0.0, 0.1, 0.0, 0.1)], 0.1, 0.1
    for i in range(20):
        t, cpu = t + 0.002 + (0.2 if i == 7 else 0.0), cpu + 0.002
        calls.append(Call("target", 1, t, 0.02, cpu, 0.02))
        t, cpu = t + 0.02, cpu + 0.02
    split = phases.split(calls, decode_start=0.1, decode_end=t)
    assert split["overhead"].total_ms == pytest.approx(20 * 2.0 + 200.0)
    assert split["overhead_cpu"].calls == 20 and split["overhead_cpu"].total_ms == pytest.approx(20 * 2.0)
    assert "overhead_cpu" not in phases.split([dataclasses.replace(c, cpu_start=math.nan) for c in calls], 0.1, t)


def test_each_decode_pass_has_a_cpu_time_twin_without_a_burst_in_which_the_thread_did_not_run():
    """Assisted steps of a 10 ms draft pass and a 50 ms verification; a neighbour holds the core for
    200 ms inside one verification: its wall clock has it, its CPU-time twin does not. The prefills
    have no twin, and passes read without a CPU clock give none."""
    calls = [Call("target", 12, 0.0, 0.1, 0.0, 0.1), Call("draft", 12, 0.1, 0.02, 0.1, 0.02)]
    t = cpu = 0.12
    for i in range(10):
        calls.append(Call("draft", 1, t, 0.01, cpu, 0.01))
        t, cpu = t + 0.01, cpu + 0.01
        held = 0.2 if i == 3 else 0.0
        calls.append(Call("target", 4, t, 0.05 + held, cpu, 0.05))
        t, cpu = t + 0.05 + held, cpu + 0.05
    split = phases.split(calls, decode_start=0.1, decode_end=t)
    assert split["verify"].total_ms == pytest.approx(10 * 50.0 + 200.0) and split["verify"].calls == 10
    assert split["verify_cpu"] == PhaseCost.of([50.0] * 10)
    assert split["draft_step_cpu"] == PhaseCost.of([10.0] * 10) == split["draft_step"]
    assert phases.CPU_TIME_OF["verify"] == "verify_cpu" and "prefill_cpu" not in phases.PHASES
    unread = phases.split([dataclasses.replace(c, cpu_seconds=math.nan) for c in calls], 0.1, t)
    assert not {"verify_cpu", "draft_step_cpu", "target_step_cpu"} & set(unread) and "verify" in unread


def test_acceptance_by_position():
    shares = phases.acceptance_by_position([[3, 3], [2]], [[2, 0], [2]])
    assert shares == pytest.approx([2 / 3, 2 / 3, 0.0])
    assert phases.acceptance_by_position([], []) == []


def test_pooled_phases_sum_calls_and_take_the_median_of_medians():
    a = {"verify": PhaseCost(2, 20.0, 10.0, 9.0)}
    b = {"verify": PhaseCost(3, 36.0, 12.0, 11.0), "draft_step": PhaseCost(1, 2.0, 2.0, 2.0)}
    c = {"verify": PhaseCost(1, 30.0, 30.0, 30.0)}
    out = phases.pooled([a, b, c])
    assert out["verify"] == PhaseCost(6, 86.0, 12.0, 11.0)
    assert out["draft_step"].calls == 1


def test_a_plain_generation_is_one_prefill_and_a_step_per_token(target):
    r = measure_generation(target, prompt(seed=1), SETTINGS)
    assert set(r.phases) == {"prefill", "target_step", "overhead", "overhead_cpu", "target_step_cpu"}
    assert r.phases["prefill"].calls == 1
    # each step's pass in CPU time too: one a step, and no more than the wall clock saw of it
    assert r.phases["target_step_cpu"].calls == r.phases["target_step"].calls
    assert r.phases["target_step_cpu"].total_ms <= r.phases["target_step"].total_ms * 1.05 + 1.0
    # the host work in CPU time: a step each, and no more than the wall clock saw of it (a small slack
    # for the two clocks' resolution)
    assert r.phases["overhead_cpu"].calls == r.phases["overhead"].calls
    assert r.phases["overhead_cpu"].total_ms <= r.phases["overhead"].total_ms * 1.05 + 1.0
    assert r.phases["target_step"].calls == r.new_tokens - 1 == r.target_forwards - 1
    passes = r.phases["target_step"].total_ms + r.phases["overhead"].total_ms
    assert passes == pytest.approx(r.decode_s * 1000, rel=1e-6)  # the decode phase, all of it
    assert r.phases["prefill"].total_ms <= r.prefill_ms


def test_an_assisted_generation_files_every_pass(target):
    draft = perturbed(target, 0.6, seed=3)
    r = measure_generation(target, prompt(seed=2), SETTINGS, mode="assisted", k=K, assistant=draft)
    # a decode step verifies what it drafted; one that drafted nothing (no room left) is a one-token step
    decode_steps = r.drafted_per_step[1:]
    assert len(decode_steps) == r.target_forwards - 1
    assert r.phases["verify"].calls == sum(1 for d in decode_steps if d > 0)
    assert r.phases.get("target_step", PhaseCost(0, 0.0, 0.0, 0.0)).calls == sum(1 for d in decode_steps if d == 0)
    # every decode step drafts its tokens with one draft pass each; the first step's are in the prefill
    assert r.phases["draft_step"].calls == sum(r.drafted_per_step[1:])
    decode = sum(r.phases[p].total_ms for p in ("target_step", "verify", "draft_step", "overhead") if p in r.phases)
    assert decode == pytest.approx(r.decode_s * 1000, rel=1e-6)


def interleaved(pairs: dict[str, tuple], ids, repeats: int = 4) -> dict[str, dict[str, PhaseCost]]:
    """Each arm's phases pooled over `repeats` assisted runs, the arms alternating (a load burst on
    a shared host hits both alike); the arms must write the same tokens."""
    runs: dict[str, list] = {name: [] for name in pairs}
    for _ in range(repeats):
        for name, (t, d) in pairs.items():
            runs[name].append(measure_generation(t, ids, SETTINGS, mode="assisted", k=K, assistant=d))
    first = [rs[0].tokens for rs in runs.values()]
    assert all(tokens == first[0] for tokens in first)
    return {name: phases.pooled(r.phases for r in rs) for name, rs in runs.items()}


def compared(pooled: dict[str, dict[str, PhaseCost]], names: tuple[str, ...]) -> tuple[dict[str, float], dict[str, float]]:
    """Per phase, the slow arm against the base: the ratio of medians, and the time gained (total ms)."""
    slow, base = pooled["slow"], pooled["base"]
    return ({p: slow[p].median_ms / base[p].median_ms for p in names},
            {p: slow[p].total_ms - base[p].total_ms for p in names})


def test_a_slower_draft_shows_in_the_draft_step_and_not_in_the_verification(target):
    """Planted: every draft pass 3x slower. Its median moves by about 4x, and the time the step gained
    lands in the draft step, not in the verification: a verification right after a spin runs colder
    (as in the glue test below), so it is held to the time it gained, not to a ratio."""
    ids = prompt(seed=2)
    base_draft = perturbed(target, 0.6, seed=3)
    slow_draft = perturbed(target, 0.6, seed=3)
    PlantedSlowdown(slow_draft, 3.0)
    pooled = interleaved({"base": (target, base_draft), "slow": (target, slow_draft)}, ids)
    ratio, gained = compared(pooled, ("draft_step", "verify"))
    assert ratio["draft_step"] > 2.5, ratio
    assert gained["verify"] < 0.3 * gained["draft_step"], (gained, ratio)


def test_a_slower_draft_reaches_the_fused_loop(target):
    """The fused loop runs the draft's layers without the model's forward, so a draft planted through
    the forward alone would not slow it: planted for a fused run, its draft step moves by about 4x."""
    from harness.perf import plant

    ids, fused = prompt(seed=2), DecodeSettings(max_new_tokens=40, fused_draft=True)
    drafts = {"base": perturbed(target, 0.6, seed=3), "slow": perturbed(target, 0.6, seed=3)}
    plant.plant(target, drafts["slow"], "draft", 3.0, fused_draft=True)
    runs: dict[str, list] = {name: [] for name in drafts}
    for _ in range(3):
        for name, d in drafts.items():
            runs[name].append(measure_generation(target, ids, fused, mode="assisted", k=K, assistant=d))
    assert runs["base"][0].tokens == runs["slow"][0].tokens
    pooled = {name: phases.pooled(r.phases for r in rs) for name, rs in runs.items()}
    ratio = pooled["slow"]["draft_step"].median_ms / pooled["base"]["draft_step"].median_ms
    assert ratio > 2.5, ratio


@pytest.mark.parametrize("only_verify", [False, True])
def test_a_planted_slowdown_does_its_own_work_inside_the_pass_it_slows(monkeypatch, only_verify):
    """The plant's clock reads, its check for a verification and its spin all fall between the pass
    timer's two clock reads, though the plant was put on the model before the timer attached (as a
    run does): none of it may land in the host overhead around the pass."""
    import types

    import torch

    from harness.perf import plant

    log: list[str] = []
    monkeypatch.setattr(plant, "time", types.SimpleNamespace(perf_counter=lambda: log.append("plant") or 0.0))
    monkeypatch.setattr(plant, "_spin", lambda seconds: log.append("spin"))
    checked = plant.is_verification
    monkeypatch.setattr(plant, "is_verification", lambda a, kw: log.append("check") or checked(a, kw))
    model = tiny_model("llama", seed=0)
    plant.PlantedSlowdown(model, 0.1, only_verify=only_verify)
    timer = phases.PassTimer(clock=lambda: log.append("timer") or float(len(log)))
    handles = timer.attach(model, "target")
    model(input_ids=torch.tensor([[1, 2, 3]]))
    for h in handles:
        h.remove()
    assert log[0] == log[-1] == "timer" and log.count("timer") == 2, log
    assert log.count("plant") == (1 if only_verify else 2) and log.count("check") == only_verify, log
    assert ("spin" in log) != only_verify, log  # a prefill is not a verification


def test_a_round_carries_its_phases_and_refuses_malformed_ones():
    doc = {"plain_tokens_per_sec": 3.0, "assisted_tokens_per_sec": 7.5, "speedup": 2.5,
           "counters": {"p0": {"new_tokens": 32, "drafted": 30, "accepted": 25, "target_forwards": 7}},
           "phases": {"verify": {"calls": 6, "total_ms": 60.0, "median_ms": 10.0, "low_ms": 9.0}},
           "acceptance_by_position": [0.9, 0.5]}
    r = Round.from_json(doc, "worker base")
    assert r.phases["verify"].median_ms == 10.0 and r.acceptance_by_position == [0.9, 0.5]
    assert Round.from_json(r.to_json(), "again") == r
    old = Round.from_json({k: v for k, v in doc.items() if k not in ("phases", "acceptance_by_position")}, "old worker")
    assert old.phases is None and old.acceptance_by_position is None
    for bad, field in (({"warp": {"calls": 1, "total_ms": 1, "median_ms": 1, "low_ms": 1}}, "phases"),
                       ({"verify": {"calls": 1}}, "verify"),
                       ({"verify": {"calls": 1, "total_ms": -1.0, "median_ms": 1, "low_ms": 1}}, "verify")):
        with pytest.raises(RecordError, match=f"worker base: round (field|phase) '{field}'"):
            Round.from_json({**doc, "phases": bad}, "worker base")
    # a worker's answer: a phase this revision does not know (a newer worker's) is set aside and named;
    # malformed ones are refused as from a file
    newer, unknown = worker_round({**doc, "phases": {**doc["phases"], "warp": {"calls": 1}}}, "worker base")
    assert newer == r and unknown == ["warp"]
    with pytest.raises(RecordError, match="worker base: round field 'phases'"):
        worker_round({**doc, "phases": ["verify"]}, "worker base")
    with pytest.raises(RecordError, match="acceptance_by_position"):
        Round.from_json({**doc, "acceptance_by_position": [1.5]}, "worker base")


@pytest.mark.parametrize("into", ["verify", "glue"])
def test_a_planted_verification_or_glue_slowdown_shows_in_its_own_phase(target, into):
    """Planted into the verification passes (3x), or as host work before each (10 times the pass):
    the phase it names moves, the draft step does not, and the glue's time lands outside every pass
    (in the overhead). A verification right after a spin runs somewhat colder (1.2-1.9x on these
    sub-millisecond passes), so the glue case compares the time each phase gained, not ratios."""
    from harness.perf import plant

    ids = prompt(seed=2)
    draft = perturbed(target, 0.6, seed=3)
    slow_target = tiny_model("llama", seed=0)
    if into == "glue":
        plant.PlantedGlue(slow_target, 10.0)
    else:
        plant.PlantedSlowdown(slow_target, 3.0, only_verify=True)
    pooled = interleaved({"base": (target, draft), "slow": (slow_target, draft)}, ids)
    ratio, gained = compared(pooled, ("verify", "draft_step", "overhead"))
    moved = "verify" if into == "verify" else "overhead"
    assert ratio[moved] > 2.0, ratio
    assert 0.5 < ratio["draft_step"] < 1.6, ratio
    if into == "glue":
        assert gained["verify"] < 0.3 * gained["overhead"], (gained, ratio)
    plain = measure_generation(slow_target, ids, SETTINGS)  # the prefill and plain steps are not verifications
    plain_base = measure_generation(target, ids, SETTINGS)
    assert plain.phases["target_step"].median_ms < 2.0 * plain_base.phases["target_step"].median_ms


def test_runs_add_up_each_at_its_own_medians():
    a = phases.Accounting(decode_tokens=10, measured_ms=1000.0, passes_ms=900.0, overhead_ms=50.0)
    b = phases.Accounting(decode_tokens=30, measured_ms=2000.0, passes_ms=1900.0, overhead_ms=60.0)
    both = phases.combined([a, None, b])
    assert (both.decode_tokens, both.measured_ms, both.passes_ms, both.overhead_ms) == (40, 3000.0, 2800.0, 110.0)
    assert both.error == pytest.approx(2800 / 3000 - 1)
    assert phases.combined([None]) is None


def _row(prompt_id: str, mode: str, cost: dict[str, float], e: float | None = None, drafted: int | None = None):
    from harness.measure.record import Row

    sample = {"prompt_tokens": 10, "new_tokens": 20, "total_s": 2.0, "prefill_ms": 100.0, "time_per_token_ms": 100.0,
              "tokens_per_sec": 10.0, "cpu_s": 2.0, "target_forwards": 20, "drafted": drafted, "accepted": None,
              "mean_accepted_length": e, "accepted_per_step": None, "drafted_per_step": None, "tokens": [1] * 20,
              "phases": {p: PhaseCost(5, ms * 5, ms, ms).as_dict() for p, ms in cost.items()}}
    return Row(example=1, prompt_id=prompt_id, configuration=mode if mode == "plain" else "assisted k=4", mode=mode,
               k=None if mode == "plain" else 4, prompt_tokens=10, new_tokens=20, total_s=2.0, prefill_ms=100.0,
               time_per_token_ms=100.0, tokens_per_sec=10.0, cpu_s=2.0, target_forwards=20, drafted=drafted,
               accepted=None, mean_accepted_length=e, speedup=None, same_tokens_as_plain=None, samples=[sample])


def test_the_predicted_speedup_is_each_prompts_own_then_the_median():
    """Per prompt, E / (K c + r) from that prompt's passes: (3 / 1.6, 5 / 1.6) -> median 2.5. One
    median of the costs over both prompts would give another figure (their costs differ 2x)."""
    from harness.measure.bench import BenchResult, Configuration, summarize

    rows = [_row("a", "plain", {"target_step": 100.0}), _row("b", "plain", {"target_step": 200.0}),
            _row("a", "assisted", {"verify": 120.0, "draft_step": 10.0}, e=3.0),
            _row("b", "assisted", {"verify": 240.0, "draft_step": 20.0}, e=5.0)]
    summary = summarize(rows, [Configuration("plain"), Configuration("assisted", 4)])
    result = BenchResult(config=None, target={}, draft=None, rows=rows, summary=summary)
    assisted = summary[1]
    assert result.predicted(assisted) == pytest.approx((3 / 1.6 + 5 / 1.6) / 2)
    assert result.predicted(summary[0]) is None
    assert assisted.phases["verify"].calls == 10 and assisted.accounting is not None
    # steps that stopped before K (a confidence threshold): the draft passes they made, 2 a step, not 4
    rows[2:] = [_row("a", "assisted", {"verify": 120.0, "draft_step": 10.0}, e=3.0, drafted=40),
                _row("b", "assisted", {"verify": 240.0, "draft_step": 20.0}, e=5.0, drafted=40)]
    result = BenchResult(config=None, target={}, draft=None, rows=rows, summary=summary)
    assert result.predicted(assisted) == pytest.approx((3 / 1.4 + 5 / 1.4) / 2)
