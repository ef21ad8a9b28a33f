"""Planted slowdowns: the gate's check of itself (`--perf-plant-slowdown`, `--perf-plant-into`,
benchmarks/ab_power.py). Each makes one part of an assisted step slower by spinning, which keeps
the core busy as slower code would (a sleep would free the core):

  target   every forward pass of the target
  draft    every forward pass of the draft
  verify   the target's verification passes only (more than one new token after the prompt)
  glue     host work before each verification, outside every pass: FRACTION of the previous
           verification pass's time (harness/measure/phases.py files it as overhead)
"""

from __future__ import annotations

import functools
import time
from typing import Any

from harness.measure import phases

PLANT_INTO = ("target", "draft", "verify", "glue")  # --perf-plant-into: where a planted slowdown goes
ASSISTED_ONLY = ("draft", "verify", "glue")         # those that need an assisted combination
# The gated phases each place slows (harness/measure/phases.py), on the wall clock and in CPU time: a
# regression message should name one of them.
PHASE_OF = {place: (wall, phases.CPU_TIME_OF[wall]) for place, wall in
            (("target", phases.TARGET_STEP), ("draft", phases.DRAFT_STEP), ("verify", phases.VERIFY),
             ("glue", phases.OVERHEAD))}


def _spin(seconds: float) -> None:
    """Keep the core busy for `seconds`, as slower code would (a sleep would free the core)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def is_verification(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A target pass over more than one new token after the prompt is cached: an assisted step's
    verification (the prefill, also wide, starts at position 0)."""
    positions = kwargs.get("cache_position")
    if positions is not None and positions.numel():
        started = int(positions.reshape(-1)[0]) > 0
    else:
        cache = kwargs.get("past_key_values")
        started = cache is not None and cache.get_seq_length() > 0
    return started and phases.new_tokens(args, kwargs) > 1


class PlantedSlowdown:
    """Makes the forward passes of a model `fraction` slower by spinning after each (the gate's own
    check: `--perf-plant-slowdown`, benchmarks/ab_power.py); `only_verify`: the target's
    verification passes only. `fraction` may change between rounds (one model load for every level).

    It wraps the model's forward rather than hooking it, so that all of its own work (the clock
    reads, telling a verification apart, the spin) runs inside the pass as slower code would, between
    the pass timer's hooks (harness/measure/phases.py): a hook of its own that ran before the timer's
    put that work in the host overhead of the step instead (docs/perf-gate.md, "A planted slowdown
    stays in its phase")."""

    def __init__(self, model: Any, fraction: float = 0.0, *, only_verify: bool = False):
        self.fraction = fraction
        forward = model.forward

        @functools.wraps(forward)  # keeps forward's signature, which transformers' generate inspects
        def slower(*args: Any, **kwargs: Any) -> Any:
            planted = not only_verify or is_verification(args, kwargs)  # before the pass fills the cache
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            if planted:
                _spin((time.perf_counter() - t0) * self.fraction)
            return out

        model.forward = slower


class PlantedGlue:
    """Slower host code between the passes of an assisted step: before each verification pass,
    spin `fraction` of the previous verification pass's time, outside every pass (its hook runs
    before any other, so the pass timer files the spin as host overhead: harness/measure/phases.py)."""

    def __init__(self, model: Any, fraction: float = 0.0):
        self.fraction = fraction
        last = [0.0]

        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            verification = is_verification(args, kwargs)
            if verification and last[0]:
                _spin(last[0] * self.fraction)
            module._glue = (time.perf_counter(), verification)

        def after(module: Any, args: Any, output: Any) -> None:
            t0, verification = module._glue
            if verification:
                last[0] = time.perf_counter() - t0

        model.register_forward_pre_hook(before, with_kwargs=True, prepend=True)
        model.register_forward_hook(after)


def plant(target: Any, draft: Any | None, into: str, fraction: float, *, fused_draft: bool = False) -> str:
    """Plant `fraction` into the part of an assisted step `into` names (PLANT_INTO), on the module the
    run calls: the draft's fused loop where the selection drafts with it (harness/workload/fused_draft.py),
    since that loop runs the draft's layers without its forward. Returns what it slowed, for the log."""
    if into not in PLANT_INTO:
        raise ValueError(f"plant_into must be one of {', '.join(PLANT_INTO)}; got {into!r}")
    if into == "glue":
        PlantedGlue(target, fraction)
        return "host work before each verification, of the pass's time"
    if into == "draft":
        from harness.workload.fused_draft import fused  # torch: imported where a model is slowed, not by the plugin

        PlantedSlowdown(fused(draft) if fused_draft else draft, fraction)
        return "the draft's fused loop" if fused_draft else "the draft's forward pass"
    PlantedSlowdown(target, fraction, only_verify=into == "verify")
    return "the target's verification passes" if into == "verify" else "the target's forward pass"
