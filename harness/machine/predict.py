"""The speedup that step costs predict (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", with the verification cost measured instead of assumed equal to one step).

One assisted step: the draft proposes K tokens (K draft steps), the target verifies K+1 tokens in
one forward pass, and E tokens come out (E = mean accepted length: accepted + the target's own).
In units of the target's one-token step:

    speedup = E / (K * c + r)      c = draft step / target step,  r = target(K+1 tokens) / target step

With i.i.d. per-token acceptance alpha, E = (1 - alpha^(K+1)) / (1 - alpha) (the paper's Eq. 1);
with r = 1 this is the paper's improvement factor (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.machine.kernels import time_call


def expected_tokens(alpha: float, k: int) -> float:
    """E: tokens per verification step for per-token acceptance alpha and K draft tokens."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_for(e: float, k: int) -> float:
    """The per-token acceptance alpha whose E equals `e` (bisection; E grows with alpha)."""
    e = min(max(e, 1.0), float(k + 1))
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < e else (lo, mid)
    return (lo + hi) / 2


def speedup(e: float, k: float, c: float, r: float) -> float:
    """Predicted tokens/s of assisted over plain decoding."""
    return e / (k * c + r)


@dataclass(frozen=True)
class StepCosts:
    """Measured forward-pass costs with a warm KV cache (milliseconds, medians)."""

    target_ms: float            # the target, one new token
    verify_ms: float            # the target, K+1 new tokens in one pass
    draft_ms: float | None      # the draft, one new token (None without a draft model)
    k: int

    @property
    def c(self) -> float:
        return (self.draft_ms or 0.0) / self.target_ms

    @property
    def r(self) -> float:
        return self.verify_ms / self.target_ms

    def predict(self, e: float, drafted: float | None = None) -> float:
        """E / (K c + r), or with `drafted` (the mean draft tokens a step drafted, where steps stop
        before K: a confidence threshold, the text's end) E / (drafted c + r)."""
        return speedup(e, self.k if drafted is None else drafted, self.c, self.r)

    def as_dict(self) -> dict[str, Any]:
        return {"target_ms": round(self.target_ms, 3), "verify_ms": round(self.verify_ms, 3),
                "draft_ms": None if self.draft_ms is None else round(self.draft_ms, 3), "k": self.k,
                "c": round(self.c, 4), "r": round(self.r, 4)}


def forward_ms(model: Any, context: int, new: int, *, min_seconds: float = 0.5) -> float:
    """Median ms of one forward pass over `new` tokens after `context` cached tokens (the cache is
    cropped back after each pass, so every pass sees the same context)."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, context), generator=g).to(device)
    step = torch.randint(0, vocab, (1, new), generator=g).to(device)
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ctx, past_key_values=cache, use_cache=True)
        positions = torch.arange(context, context + new, device=device).unsqueeze(0)

        def one() -> None:
            model(input_ids=step, past_key_values=cache, use_cache=True, position_ids=positions)
            cache.crop(-new)  # drop what this pass appended

        return time_call(one, min_seconds=min_seconds, min_calls=5)


def measure(target: Any, draft: Any | None, ks: Iterable[int], *, context: int = 128,
            min_seconds: float = 0.5) -> dict[int, StepCosts]:
    """The step costs of a loaded pair for each K (a few seconds): the target's and the draft's
    one-token costs once, the target's K+1-token cost per K."""
    target_ms = forward_ms(target, context, 1, min_seconds=min_seconds)
    draft_ms = forward_ms(draft, context, 1, min_seconds=min_seconds) if draft is not None else None
    return {k: StepCosts(target_ms=target_ms, verify_ms=forward_ms(target, context, k + 1, min_seconds=min_seconds),
                         draft_ms=draft_ms, k=k) for k in ks}
