"""Greedy equivalence of assisted and plain decoding, with triage of the first divergence.

In fp32, assisted greedy tokens must equal plain greedy tokens exactly. In bf16/fp16 the target
verifies K+1 tokens in one batched forward, whose rounding differs from one token at a time, so
an argmax can flip where the top two logits are nearly equal (seen on HumanEval/10). Such a divergence is
accepted as a "near-tie" when, in a plain forward of the target over the common prefix (prompt +
the tokens both runs agree on):
  - the gap between the top-1 and top-2 logits is below epsilon, and
  - both divergent tokens (plain's and assisted's) have logits within epsilon of the top-1
    (so a draft token that was accepted wrongly, far below the top, is never excused).
Anything else is "failed" and reported with the prompt, the position, both tokens (ids and text)
and the gap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

EXACT, NEAR_TIE, FAILED = "exact", "near-tie", "failed"

# Logit epsilon per target precision. bf16 keeps 8 significant bits: logits of 10..30 are
# quantized in steps of 0.06..0.125, and a batched and an unbatched forward through ~30 layers
# differ by a few such steps. fp32 must be exact: its epsilon only classifies what is reported.
# Quantized targets (quant/): their integer kernels are exact, but what they are fed is not.
# bf16-activation kernels (w8abf16, w6a16, w4abf16*) round like bf16: bf16's epsilon. Int8 activations
# (w8af32, w8a8, w8af32-tensor) are coarser: a last-bit fp32 difference between a block and one
# token (attention over K+1 rows) can move a value across an int8 rounding boundary, one quantum
# of ~1/127 of the row's range, and such steps compound through the layers. How far plain
# decoding disagrees with other roundings of the same model, per CPU class, is measured in
# docs/accuracy.md ("How large a near-tie can be"; benchmarks/plain_self_agreement.py): for per-token
# int8 activations the largest seen on any class is below 2.0. Per-tensor scales (w8af32-tensor)
# disagree by up to 6.8: a draft precision, not a target's; its 1.0 keeps such a target failing.
EPSILON = {"fp32": 1e-4, "bf16": 0.5, "fp16": 0.25, "w8abf16": 0.5, "w4abf16": 0.5, "w4abf16-rtn": 0.5, "w6a16": 0.5,
           "w8af32": 2.0, "w8a8": 2.0, "w8af32-tensor": 1.0}


@dataclass
class Triage:
    prompt_id: str
    status: str                      # exact | near-tie | failed
    position: int | None = None      # index among the new tokens of the first divergence
    plain_token: int | None = None
    assisted_token: int | None = None
    plain_text: str | None = None
    assisted_text: str | None = None
    top1_top2_gap: float | None = None
    assisted_gap: float | None = None  # top-1 logit minus the assisted token's logit
    plain_gap: float | None = None     # top-1 logit minus the plain token's logit
    epsilon: float | None = None
    length_mismatch: bool = False      # one run stopped earlier, tokens equal up to there

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, prompt_text: str | None = None) -> str:
        if self.status == EXACT:
            return f"{self.prompt_id}: exact"
        head = f"{self.prompt_id}: {self.status} at new token {self.position}"
        if self.plain_token is None or self.assisted_token is None:
            return head + " (one run ended earlier: different lengths with equal tokens)"
        prompt = f"\n  prompt: {prompt_text[-200:]!r}" if prompt_text is not None else ""
        return (f"{head}: plain {self.plain_token} {self.plain_text!r} vs assisted {self.assisted_token} "
                f"{self.assisted_text!r}; top-1/top-2 logit gap {self.top1_top2_gap:.4f}, plain token "
                f"{self.plain_gap:.4f} and assisted token {self.assisted_gap:.4f} below top-1 (epsilon "
                f"{self.epsilon}){prompt}")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def next_token_logits(model: torch.nn.Module, prompt_ids: torch.LongTensor, prefix: list[int]) -> torch.Tensor:
    """The target's logits for the token after prompt + prefix, from one plain forward (fp32 copy)."""
    ids = torch.cat([prompt_ids.to(model.device), torch.tensor([prefix], dtype=torch.long, device=model.device)], dim=1)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0, -1].float()


def triage(model: torch.nn.Module, prompt_id: str, prompt_ids: torch.LongTensor, plain: list[int],
           assisted: list[int], epsilon: float, tokenizer: Any = None) -> Triage:
    pos = first_divergence(plain, assisted)
    if pos is None:
        return Triage(prompt_id, EXACT)
    if pos >= min(len(plain), len(assisted)):
        # equal tokens, one run stopped earlier: only a stop criterion can do that, never a near-tie
        return Triage(prompt_id, FAILED, position=pos, epsilon=epsilon, length_mismatch=True)
    logits = next_token_logits(model, prompt_ids, plain[:pos])
    top = torch.topk(logits, 2)
    top1, top2 = float(top.values[0]), float(top.values[1])
    p_tok, a_tok = plain[pos], assisted[pos]
    gap = top1 - top2
    a_gap, p_gap = top1 - float(logits[a_tok]), top1 - float(logits[p_tok])
    near = gap < epsilon and a_gap < epsilon and p_gap < epsilon
    decode = (lambda t: tokenizer.decode([t])) if tokenizer is not None else (lambda t: None)
    return Triage(prompt_id, NEAR_TIE if near else FAILED, position=pos, plain_token=p_tok, assisted_token=a_tok,
                  plain_text=decode(p_tok), assisted_text=decode(a_tok), top1_top2_gap=gap, assisted_gap=a_gap,
                  plain_gap=p_gap, epsilon=epsilon)


def counts(results: list[Triage]) -> dict[str, int]:
    return {s: sum(r.status == s for r in results) for s in (EXACT, NEAR_TIE, FAILED)}


def summary_line(label: str, results: list[Triage]) -> str:
    c = counts(results)
    return f"{label}: {len(results)} prompts: {c[EXACT]} exact, {c[NEAR_TIE]} near-tie, {c[FAILED]} failed"
