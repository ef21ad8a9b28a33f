"""One interleave (harness/measure/interleave): an ABBA order that favours no arm, and a brief warm-up of
every arm (the decode settings' one builder is harness/workload/selection.py: tests/unit/test_selection.py)."""

from __future__ import annotations

from itertools import permutations

import pytest

from harness.measure import interleave
from harness.workload.decode import DecodeSettings


def test_abba_puts_every_arm_first_and_last_equally_often():
    for arms in (["plain", "assisted"], [0.0, 0.05, 0.1, 0.25]):
        orders = [interleave.abba(arms, r) for r in range(4)]
        assert orders[0] == list(arms) and orders[1] == list(arms)[::-1] and orders[2] == orders[0]
        for a, b in permutations(arms, 2):  # over a pair of rounds, a precedes b exactly once
            assert sum(o.index(a) < o.index(b) for o in orders[:2]) == 1


def test_warm_up_runs_every_arm_once_briefly():
    settings = DecodeSettings(max_new_tokens=64, min_new_tokens=64)
    ran = []
    interleave.warm_up(["plain", "assisted"], lambda arm, ids, s: ran.append((arm, ids, s.max_new_tokens, s.min_new_tokens)),
                       ["p0", "p1"], settings)
    assert ran == [("plain", "p0", interleave.WARMUP_TOKENS, interleave.WARMUP_TOKENS),
                   ("assisted", "p0", interleave.WARMUP_TOKENS, interleave.WARMUP_TOKENS)]


def test_on_a_cpu_an_arm_that_verifies_sees_every_prompt_at_full_length():
    """Its passes take up to K+1 tokens: every token count and length the rounds will see is run once."""
    settings = DecodeSettings(max_new_tokens=64, min_new_tokens=64)
    ran = []
    interleave.warm_up(["plain", "assisted"], lambda arm, ids, s: ran.append((arm, ids, s.max_new_tokens)),
                       ["p0", "p1"], settings, full=["assisted"])
    assert ran == [("plain", "p0", interleave.WARMUP_TOKENS), ("assisted", "p0", 64), ("assisted", "p1", 64)]


def test_a_warm_up_of_two_cycles_runs_the_whole_warm_up_twice():
    settings = DecodeSettings(max_new_tokens=64, min_new_tokens=64)
    ran = []
    interleave.warm_up(["plain", "assisted"], lambda arm, ids, s: ran.append((arm, ids, s.max_new_tokens)),
                       ["p0", "p1"], settings, full=["assisted"], cycles=2)
    once = [("plain", "p0", interleave.WARMUP_TOKENS), ("assisted", "p0", 64), ("assisted", "p1", 64)]
    assert ran == once + once
    with pytest.raises(ValueError, match="cycles"):
        interleave.warm_up(["plain"], lambda *a: None, ["p0"], settings, cycles=0)


def test_on_a_gpu_the_warm_up_runs_every_prompt_at_full_length():
    """A GPU chooses kernels per shape on first sight: every prompt, every length the run will see."""
    settings = DecodeSettings(max_new_tokens=64, min_new_tokens=64)
    ran = []
    interleave.warm_up(["plain", "assisted"], lambda arm, ids, s: ran.append((arm, ids, s)), ["p0", "p1"], settings,
                       device="cuda", full=["assisted"])  # on a GPU every arm runs in full, named or not
    assert ran == [("plain", "p0", settings), ("assisted", "p0", settings),
                   ("plain", "p1", settings), ("assisted", "p1", settings)]


def test_a_free_length_run_warms_up_free_length_too():
    free = DecodeSettings(max_new_tokens=64)
    assert interleave.warmup_settings(free).min_new_tokens == 0
