"""The measured generation on tiny random models of the seeds' architectures (OPT, Llama, Qwen2):
assisted == plain in fp32, counters from the decoding loop agree with an independent replay."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.workload.decode import DecodeSettings
from harness.measure.generate import decode_metrics, measure_generation
from tiny_models import ARCHITECTURES, perturbed, prompt, tiny_model

K = 4
SETTINGS = DecodeSettings(max_new_tokens=40)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def target(request):
    return tiny_model(request.param, seed=0)


def drafts(target):
    arch_seed = {"opt": 11, "llama": 12, "qwen2": 13}
    unrelated = tiny_model(target.config.model_type, seed=arch_seed[target.config.model_type])
    return {"unrelated": unrelated, "perturbed": perturbed(target, 0.6, seed=3)}


def replay_acceptance(target_tokens: list[int], draft, prompt_ids: torch.LongTensor, k: int,
                      lookup_steps: list[bool] | None = None, lookup=None) -> list[int]:
    """What the acceptance per verification step must be, rebuilt from the final tokens alone:
    at each step the draft greedily proposes up to k tokens from the accepted prefix, the longest
    prefix that agrees with the output is accepted, then one target token follows. With
    `lookup_steps`, the steps flagged propose `lookup(prefix_ids, n)` instead (--lookup-first)."""
    pos, accepted = 0, []
    while pos < len(target_tokens):
        n = min(k, len(target_tokens) - pos - 1)  # transformers leaves room for the target's token
        proposal: list[int] = []
        if lookup_steps is not None and lookup_steps[len(accepted)]:
            prefix = torch.cat([prompt_ids, torch.tensor([target_tokens[:pos]], dtype=torch.long)], dim=1)
            proposal = lookup(prefix[0].tolist(), n) or []
        elif n > 0:
            prefix = torch.cat([prompt_ids, torch.tensor([target_tokens[:pos]], dtype=torch.long)], dim=1)
            out = draft.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=0)
            proposal = out[0, prefix.shape[1]:].tolist()
        m = 0
        while m < len(proposal) and proposal[m] == target_tokens[pos + m]:
            m += 1
        accepted.append(m)
        pos += m + 1
    return accepted


def test_assisted_equals_plain_in_fp32(target):
    ids = prompt(seed=1)
    plain = measure_generation(target, ids, SETTINGS)
    assert plain.new_tokens == SETTINGS.max_new_tokens
    assert plain.target_forwards == plain.new_tokens  # one target pass per token
    for name, draft in drafts(target).items():
        assisted = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=draft)
        assert assisted.tokens == plain.tokens, name
    lookup = measure_generation(target, ids, SETTINGS, mode="prompt-lookup", k=K)
    assert lookup.tokens == plain.tokens


def test_identical_draft_accepts_every_drafted_token(target):
    ids = prompt(seed=2)
    r = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=copy.deepcopy(target))
    assert r.drafted == r.accepted > 0
    assert all(a == d for a, d in zip(r.accepted_per_step, r.drafted_per_step))
    # K+1 tokens per pass until the length budget: ceil(40 / 5) passes
    assert r.target_forwards == -(-SETTINGS.max_new_tokens // (K + 1))
    assert r.mean_accepted_length == pytest.approx(SETTINGS.max_new_tokens / r.target_forwards)


@pytest.mark.parametrize("kind", ["unrelated", "perturbed"])
def test_counters_match_what_the_tokens_show(target, kind):
    ids = prompt(seed=3)
    draft = drafts(target)[kind]
    r = measure_generation(target, ids, SETTINGS, mode="assisted", k=K, assistant=draft)
    assert r.accepted_per_step == replay_acceptance(r.tokens, draft, ids, K)
    assert r.target_forwards == len(r.accepted_per_step)
    assert r.new_tokens == r.target_forwards + r.accepted
    assert r.accepted == sum(r.accepted_per_step) <= r.drafted == sum(r.drafted_per_step)


def test_perturbed_draft_gives_partial_acceptance(target):
    """Guards the test above against a degenerate case (all or nothing accepted)."""
    r = measure_generation(target, prompt(seed=3), SETTINGS, mode="assisted", k=K, assistant=drafts(target)["perturbed"])
    assert 0 < r.accepted < r.drafted


def test_prompt_lookup_counters(target):
    r = measure_generation(target, prompt(seed=4), SETTINGS, mode="prompt-lookup", k=K)
    assert r.new_tokens == r.target_forwards + r.accepted
    assert r.drafted == sum(r.drafted_per_step) >= r.accepted


def test_assistant_state_is_reset_between_runs(target):
    draft = drafts(target)["perturbed"]
    heuristic = DecodeSettings(max_new_tokens=40, schedule="heuristic")
    h = measure_generation(target, prompt(seed=5), heuristic, mode="assisted", k=K, assistant=draft)
    assert len(set(h.drafted_per_step[:-3])) > 1  # the heuristic schedule changes K as it goes
    # the state transformers leaves on the assistant after heuristic runs: K moved, threshold 0.4
    draft.generation_config.num_assistant_tokens = 1
    draft.generation_config.assistant_confidence_threshold = 0.4
    r = measure_generation(target, prompt(seed=5), SETTINGS, mode="assisted", k=K, assistant=draft)
    budget = SETTINGS.max_new_tokens
    produced = 0
    for drafted, accepted in zip(r.drafted_per_step, r.accepted_per_step):
        assert drafted == min(K, budget - produced - 1)
        produced += accepted + 1


def test_timings_are_consistent(target):
    r = measure_generation(target, prompt(seed=6), SETTINGS, mode="assisted", k=K, assistant=drafts(target)["perturbed"])
    assert 0 < r.prefill_ms / 1000 < r.total_s
    expected_tpt, _ = decode_metrics(r.total_s, r.prefill_ms / 1000, r.new_tokens, r.accepted_per_step[0] + 1)
    assert r.time_per_token_ms == pytest.approx(expected_tpt)
    assert r.tokens_per_sec == pytest.approx(1000 / r.time_per_token_ms)
    assert r.cpu_s > 0


def test_decode_metrics_definition():
    # the reference's definition: (total - prefill) / (new - 1) for plain decoding
    assert decode_metrics(2.0, 0.5, 16, 1) == pytest.approx((1500 / 15, 15 / 1.5))
    # an assisted first pass that produced 4 tokens: those count with the prefill
    assert decode_metrics(2.0, 0.5, 16, 4)[0] == pytest.approx(1500 / 12)
    assert decode_metrics(1.0, 1.0, 1, 1) == (None, None)


def test_bad_calls_are_refused(target):
    with pytest.raises(ValueError, match="assistant model is needed"):
        measure_generation(target, prompt(), SETTINGS, mode="assisted", k=K)
    with pytest.raises(ValueError, match="shape"):
        measure_generation(target, torch.cat([prompt(), prompt()]), SETTINGS)
    with pytest.raises(ValueError, match="mode must be"):
        measure_generation(target, prompt(), SETTINGS, mode="beam")


def test_a_cuda_clock_waits_for_the_device_before_each_read(monkeypatch):
    """On a GPU a launch returns before the kernel ran: every clock read that ends GPU work must
    synchronize first. A stand-in records the order of synchronizes and clock reads."""
    from harness.core import timing

    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(f"sync {device}"))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: events.append("read") or float(len(events)))
    clock = timing.device_clock(torch.device("cuda", 0))
    clock()
    assert events == ["sync cuda:0", "read"]
    assert timing.device_clock(torch.device("cpu")) is timing.time.perf_counter  # a CPU waits for nothing


def test_a_generation_on_cuda_synchronizes_at_start_prefill_and_end_only(target, monkeypatch):
    """The tiny model runs on the CPU with the clock a CUDA device would get: three synchronized
    reads (start, the end of the first forward pass, the end), none per later forward pass."""
    from harness.core import timing
    from harness.measure import generate

    events: list[str] = []
    cuda_clock = timing.device_clock(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(generate.timing, "device_clock", lambda device: cuda_clock)
    hook = target.register_forward_hook(lambda module, args, output: events.append("forward"))
    try:
        r = measure_generation(target, prompt(seed=6), SETTINGS)
    finally:
        hook.remove()
    forwards = events.count("forward")
    assert r.target_forwards == forwards > 3
    assert events.count("sync") == 3
    assert events[0] == "sync" and events[-1] == "sync"
    first = events.index("forward")  # this test's hook runs first, then the harness's reads the prefill's end
    assert events[first + 1] == "sync" and "sync" not in events[first + 2:-1]
    assert 0 < r.prefill_ms < r.total_s * 1000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuda: no CUDA device (torch.cuda.is_available() is False)")
def test_on_a_gpu_the_prefill_holds_the_gpu_work_not_its_launch(target):
    """A kernel of about 0.1 s queued inside the first forward pass: the prefill must hold it, which
    it does only if the clock read at its end waited for the device."""
    model = copy.deepcopy(target).to("cuda")
    slept: list[bool] = []

    def first_pass_queues_a_long_kernel(module, args) -> None:
        if not slept:
            slept.append(True)
            torch.cuda._sleep(100_000_000)  # GPU cycles: about 0.05-0.1 s; returns at once on the host

    hook = model.register_forward_pre_hook(first_pass_queues_a_long_kernel)
    try:
        r = measure_generation(model, prompt(seed=6), SETTINGS)
    finally:
        hook.remove()
    assert r.prefill_ms > 20, r.prefill_ms
    assert r.total_s * 1000 > r.prefill_ms


def test_a_thread_that_touches_fresh_memory_takes_a_page_fault_a_page():
    """The perf gate's rounds count the generating thread's page faults (harness/core/timing.py): a
    page touched for the first time is one, a page touched again is none."""
    import mmap

    from harness.core import timing

    pages = 4096
    buf = mmap.mmap(-1, pages * mmap.PAGESIZE)  # anonymous: no page backed until touched
    try:
        buf.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages, a fault each, where huge pages are on for every mapping
        before = timing.thread_page_faults()
        for off in range(0, len(buf), mmap.PAGESIZE):
            buf[off] = 1
        first = timing.thread_page_faults()
        for off in range(0, len(buf), mmap.PAGESIZE):
            buf[off] = 2
        again = timing.thread_page_faults()
    finally:
        buf.close()
    assert pages * 0.9 <= first - before <= pages * 1.1
    assert again - first < pages * 0.01


def test_forced_length_scores_equal_transformers_min_new_tokens():
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor
    from harness.measure.generate import ForcedLength
    torch.manual_seed(0)
    scores = torch.randn(1, 50)
    eos = [7, 31, 99]  # 99: outside this vocabulary, masks nothing in either
    ours, theirs = ForcedLength(10, 4, torch.tensor(eos)), MinNewTokensLengthLogitsProcessor(10, 4, eos)
    for length in (10, 13, 14, 20):  # 0 and 3 new tokens: masked; 4 and 10: not
        ids = torch.zeros(1, length, dtype=torch.long)
        assert torch.equal(ours(ids, scores), theirs(ids, scores)), length
    assert torch.isinf(ours(torch.zeros(1, 13, dtype=torch.long), scores)[0, [7, 31]]).all()
    assert torch.isfinite(scores).all()  # the caller's scores are left as they were


FIXED_MODES = {  # name: (mode, settings beyond the length, whether transformers' draft loop runs)
    "plain": ("plain", {}, False),
    "assisted": ("assisted", {}, True),
    "assisted, fused draft": ("assisted", {"fused_draft": True}, False),
    "assisted, lookup first": ("assisted", {"lookup_first": 3}, True),
    "prompt-lookup": ("prompt-lookup", {}, False),
}


@pytest.mark.parametrize("arch, name", [(arch, name) for arch in ARCHITECTURES for name in FIXED_MODES
                                        if arch != "opt" or "fused" not in name])  # the fused loop: Llama, Qwen2
def test_a_fixed_length_runs_past_the_eos_as_transformers_min_new_tokens_does(arch, name, monkeypatch):
    """ForcedLength against transformers' min-length processors (the suite's path before it): the
    same tokens and the same drafting and acceptance at every step, and transformers' vocabulary-sized
    masks never run on the target."""
    from harness.measure import generate
    from transformers.generation import logits_process
    mode, extra, transformers_drafts = FIXED_MODES[name]
    target = tiny_model(arch, seed=0)
    ids = prompt(seed=8)
    free = measure_generation(target, ids, SETTINGS).tokens
    eos = free[3]  # the target's text would end by its fourth token
    n = SETTINGS.max_new_tokens
    fixed = DecodeSettings(max_new_tokens=n, min_new_tokens=n, **extra)
    kw = {"k": K} if mode != "plain" else {}
    if mode == "assisted":
        kw["assistant"] = drafts(target)["perturbed"]
    target.generation_config.eos_token_id = [eos, 10_000]  # 10,000: outside the vocabulary, masks nothing
    target.generation_config.min_length = 5  # a checkpoint's minimum (shorter than the prompt) stays out of it
    stopped = measure_generation(target, ids, SETTINGS, mode=mode, **kw)
    # transformers' draft loop runs MinLengthLogitsProcessor at each draft step whatever the settings (it
    # asks the draft for at least 0 new tokens, which sets min_length): that one is the target's only where
    # no draft loop of transformers' runs
    slow = [logits_process.MinNewTokensLengthLogitsProcessor] + ([] if transformers_drafts else
                                                                 [logits_process.MinLengthLogitsProcessor])
    with monkeypatch.context() as m:
        for cls in slow:
            m.setattr(cls, "__call__", lambda *a, **k: pytest.fail("a greedy fixed length ran transformers' mask"))
        forced = measure_generation(target, ids, fixed, mode=mode, **kw)
    with monkeypatch.context() as m:
        m.setattr(generate, "_forced_length", lambda *a: None)  # transformers' processors, as before
        before = measure_generation(target, ids, fixed, mode=mode, **kw)
    assert stopped.tokens[-1] == eos and len(stopped.tokens) < 10  # the EOS ends an unforced run
    assert len(forced.tokens) == n and eos not in forced.tokens
    assert forced.tokens == before.tokens
    for counter in ("drafted_per_step", "accepted_per_step", "lookup_per_step"):
        assert getattr(forced, counter) == getattr(before, counter), counter
