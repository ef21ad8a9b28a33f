"""Decode settings have one builder (harness/core/decode.for_pair) and one interleave
(harness/core/interleave): the pair's registry values unless the caller gives its own, sampling
switches that mean the same everywhere, and an ABBA order that favours no arm."""

from __future__ import annotations

from itertools import permutations

from harness.core import decode, interleave
from harness.core.registry import load_matrix
from tiny_models import write_local_matrix


def pair(tmp_path, name="tiny+draft"):
    return load_matrix(write_local_matrix(tmp_path)).pair(name)


def test_the_pair_gives_what_the_caller_does_not(tmp_path):
    p = pair(tmp_path)
    s = decode.for_pair(p, max_new_tokens=32)
    assert (s.num_assistant_tokens, s.schedule, s.confidence_threshold) == (p.num_assistant_tokens, p.schedule,
                                                                            p.confidence_threshold)
    assert (s.min_new_tokens, s.do_sample, s.temperature, s.top_p) == (0, False, 1.0, 1.0)
    o = decode.for_pair(p, max_new_tokens=32, num_assistant_tokens=3, schedule="heuristic", confidence_threshold=0.0,
                        fixed_length=True, stop_sequences=["\ndef"])
    assert (o.num_assistant_tokens, o.schedule, o.min_new_tokens, o.stop_sequences) == (3, "heuristic", 32, ("\ndef",))


def test_temperature_and_top_p_apply_only_to_sampling(tmp_path):
    p = pair(tmp_path)
    greedy = decode.for_pair(p, max_new_tokens=8, temperature=0.1, top_p=0.9)
    assert (greedy.temperature, greedy.top_p) == (1.0, 1.0)
    sampled = decode.for_pair(p, max_new_tokens=8, do_sample=True, temperature=0.1, top_p=0.9, seed=7)
    assert (sampled.do_sample, sampled.temperature, sampled.top_p, sampled.seed) == (True, 0.1, 0.9, 7)


def test_abba_puts_every_arm_first_and_last_equally_often():
    for arms in (["plain", "assisted"], [0.0, 0.05, 0.1, 0.25]):
        orders = [interleave.abba(arms, r) for r in range(4)]
        assert orders[0] == list(arms) and orders[1] == list(arms)[::-1] and orders[2] == orders[0]
        for a, b in permutations(arms, 2):  # over a pair of rounds, a precedes b exactly once
            assert sum(o.index(a) < o.index(b) for o in orders[:2]) == 1


def test_warm_up_runs_every_arm_once_briefly(tmp_path):
    settings = decode.for_pair(pair(tmp_path), max_new_tokens=64, fixed_length=True)
    ran = []
    interleave.warm_up(["plain", "assisted"], lambda arm, s: ran.append((arm, s.max_new_tokens, s.min_new_tokens)),
                       settings)
    assert ran == [("plain", interleave.WARMUP_TOKENS, interleave.WARMUP_TOKENS),
                   ("assisted", interleave.WARMUP_TOKENS, interleave.WARMUP_TOKENS)]
    free = decode.for_pair(pair(tmp_path / "b"), max_new_tokens=64)
    assert interleave.warmup_settings(free).min_new_tokens == 0
