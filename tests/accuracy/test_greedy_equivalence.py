"""Greedy equivalence on real models: assisted (draft or prompt lookup) == plain greedy, token for token
in fp32; in bf16 equal or first different at a near-tie (harness/accuracy/equivalence.py states the rule and
the epsilon). Prints per prompt and a summary line: exact / near-tie / failed."""

from __future__ import annotations

import pytest

from harness.accuracy import equivalence as eq
import dataclasses

from harness.workload import prompts
from harness.workload.registry import CHOSEN
from harness.workload.selection import Request, resolve
from harness.measure.generate import ASSISTED, PROMPT_LOOKUP, measure_generation
from accuracy_common import load, matrix, save

pytestmark = [pytest.mark.accuracy, pytest.mark.real]

# (pair, target precision, draft precision or None, max new tokens, marks[, attention of both models])
# The rows in make test (not slow) decode 32 new tokens a prompt, the slow ones 48: a bug in how a
# rejected draft is rolled back shows at the first rejection, within the first steps, and make test
# has a 30-minute budget on the slowest host (docs/ci.md).
COMBINATIONS = [
    ("smollm2-135m+self", "fp32", "fp32", 32, []),
    # eager attention (harness/workload/attention.py) instead of transformers' default sdpa
    ("smollm2-135m+self", "fp32", "fp32", 32, [], "eager"),
    ("smollm2-135m+self", "bf16", "w8af32", 32, []),
    # a quantized target: per-token activation scales keep a verified block equal to one token at a time
    ("smollm2-135m+self", "w8af32", "w8af32", 32, []),
    ("smollm2-135m+lookup", "fp32", None, 32, []),
    ("smollm2-135m+lookup", "bf16", None, 32, []),
    # the precisions harness/matrix.toml chooses for this machine's CPU class (python -m harness doctor)
    ("qwen-coder-1.5b+0.5b", CHOSEN, CHOSEN, 48, [pytest.mark.slow]),
    # the pair's fastest preset for this CPU class (bench --preset fastest): precisions and K
    ("qwen-coder-1.5b+0.5b", "fastest", "fastest", 32, []),
    ("qwen-coder-1.5b+0.5b", "bf16", "w8af32-tensor", 48, [pytest.mark.slow]),  # the pair's default draft
    # eager attention at this class's own choice: the target's attention over a verified block is what
    # decides the output (a draft in the fused loop runs its own attention; the SmolLM2 row covers a
    # draft's eager attention). A fixed bf16 costs minutes where bf16 has no fast kernel (docs/ci.md).
    ("qwen-coder-1.5b+0.5b", CHOSEN, CHOSEN, 32, [], "eager"),
    ("qwen-coder-1.5b+0.5b", "w6a16", "w8af32-tensor", 48, [pytest.mark.slow]),  # the reference's 6-bit target
    ("qwen-coder-1.5b+0.5b", "bf16", "w8af32", 48, [pytest.mark.slow]),
    ("qwen-coder-1.5b+0.5b", "bf16", "bf16", 48, [pytest.mark.slow]),
    ("qwen-coder-1.5b+0.5b", "w4abf16", "bf16", 48, [pytest.mark.slow]),
    ("qwen-coder-1.5b+0.5b", "w4abf16", "w8af32", 48, [pytest.mark.slow]),
    ("qwen-coder-1.5b+0.5b", "w8af32", "w8af32", 48, [pytest.mark.slow]),
    # fp32 1.5B + 0.5B needs about 10 GB: only where memory allows (skipped below otherwise)
    ("qwen-coder-1.5b+0.5b", "fp32", "fp32", 48, [pytest.mark.slow]),
]


def _attention(c) -> str | None:
    return c[5] if len(c) > 5 else None


def _id(c):
    return f"{c[0]}:{c[1]}+{c[2] or 'lookup'}" + (f":attn-{_attention(c)}" if _attention(c) else "")


@pytest.mark.parametrize("combo", [pytest.param(c, marks=c[4], id=_id(c)) for c in COMBINATIONS])
def test_assisted_equals_plain(combo):
    pair_name, tp, dp, max_new = combo[:4]
    attention = _attention(combo)
    if tp == "fp32" and "1.5b" in pair_name:
        import psutil

        if psutil.virtual_memory().available < 16 << 30:
            pytest.skip("fp32 1.5B target + fp32 draft needs about 10 GB; less than 16 GB available here")
    m = matrix()
    request = Request(pair=pair_name, max_new_tokens=max_new, attention=attention, given_by="the test's parameters")
    if tp == CHOSEN:
        pass  # the pair's choice for this CPU class
    elif tp in m.pair(pair_name).presets:
        if m.cpu_class not in m.pair(pair_name).presets[tp]:
            pytest.skip(f"{pair_name} has no {tp} preset for CPU class {m.cpu_class} "
                        f"(measured on: {', '.join(m.pair(pair_name).presets[tp])})")
        request = dataclasses.replace(request, preset=tp)
    else:
        request = dataclasses.replace(request, target_precision=tp, draft_precision=dp)
    sel = resolve(m, request)
    tp = sel.target.precision
    if request.preset or tp == CHOSEN or sel.reasons:
        print(f"\n{pair_name}: {sel.precisions}, K={sel.k}\n" + "\n".join(sel.reasons))
    target = load(sel.target.spec, tp, attention=attention)
    draft = (load(sel.draft.spec, sel.draft.precision, draft_vocab=sel.draft.draft_vocab, attention=attention)
             if sel.draft else None)
    if attention:
        assert (target.attention, draft.attention if draft else attention) == (attention, attention)
    prompt_set = sel.prompt_set
    mode = ASSISTED if draft else PROMPT_LOOKUP
    settings = sel.decode
    results, texts = [], {}
    for p in prompts.load_prompts(prompt_set, target.tokenizer):
        ids = prompts.encode(p, target.tokenizer, chat_template=prompt_set.chat_template)
        plain = measure_generation(target.model, ids, settings).tokens
        assisted = measure_generation(target.model, ids, settings, mode=mode, k=sel.k,
                                      assistant=draft.model if draft else None).tokens
        results.append(eq.triage(target.model, p.id, ids, plain, assisted, eq.EPSILON[tp], tokenizer=target.tokenizer))
        texts[p.id] = p.text
    label = f"{_id(combo)} (epsilon {eq.EPSILON[tp]})"
    # a failure shows its prompt; every prompt's text and triage is in the saved file
    lines = [r.describe(texts[r.prompt_id] if r.status == eq.FAILED else None) for r in results]
    lines.append(eq.summary_line(label, results))
    print("\n" + "\n".join(lines))
    save(f"triage-{_id(combo).replace(':', '_').replace('+', '_')}",
         {"combination": _id(combo), "epsilon": eq.EPSILON[tp], "counts": eq.counts(results),
          "prompts": [r.as_dict() for r in results]})
    c = eq.counts(results)
    if tp == "fp32":
        assert c["exact"] == len(results), "\n".join(lines)
    assert c["failed"] == 0, "\n".join(lines)
