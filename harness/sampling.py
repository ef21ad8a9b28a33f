"""Lossless sampling: assisted decoding must keep the target's distribution.

At a fixed prefix, the first `positions` new tokens are sampled many times with and without the
draft (a different seed per sample, disjoint seed ranges for the two arms so that the samples are independent), and for each position the two
histograms are compared with a chi-square test of homogeneity (a 2 x C contingency table; tokens
seen fewer than `min_count` times in both arms together are pooled into one "other" column so that
expected counts stay large enough for the chi-square approximation). The run fails when any
position's p-value is below alpha / positions (Bonferroni). With a correct sampler the test fails
with probability at most alpha; a sampler that leans towards the draft's choices fails it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch
from scipy.stats import chi2_contingency

from harness.generate import ASSISTED, PLAIN, DecodeSettings, measure_generation

ALPHA = 1e-3


@dataclass
class PositionTest:
    position: int
    statistic: float
    dof: int
    p_value: float
    categories: int


@dataclass
class SamplingTest:
    prompt_id: str
    temperature: float
    top_p: float
    samples: int
    positions: list[PositionTest]
    alpha: float

    @property
    def min_p(self) -> float:
        return min(p.p_value for p in self.positions)

    @property
    def passed(self) -> bool:
        return self.min_p >= self.alpha / len(self.positions)

    def describe(self) -> str:
        parts = ", ".join(f"pos {p.position}: chi2 {p.statistic:.1f} dof {p.dof} p {p.p_value:.3g}" for p in self.positions)
        return (f"{self.prompt_id} T={self.temperature} top_p={self.top_p} n={self.samples}: "
                f"{'same distribution' if self.passed else 'DIFFERENT distributions'} "
                f"(alpha {self.alpha} / {len(self.positions)} positions): {parts}")


def sample_tokens(target: torch.nn.Module, ids: torch.LongTensor, settings: DecodeSettings, n: int, *,
                  assistant: torch.nn.Module | None = None, positions: int = 2, seed0: int = 0) -> list[tuple[int, ...]]:
    """n samples of the first `positions` new tokens (seeds seed0 .. seed0+n-1)."""
    out = []
    for i in range(n):
        s = dataclasses.replace(settings, seed=seed0 + i, max_new_tokens=positions, min_new_tokens=positions,
                                do_sample=True)
        r = measure_generation(target, ids, s, mode=ASSISTED if assistant is not None else PLAIN, assistant=assistant)
        out.append(tuple(r.tokens[:positions]))
    return out


def homogeneity(a: list[int], b: list[int], min_count: int = 10) -> tuple[float, int, float, int]:
    """(chi2, dof, p, columns) of the 2 x C table of two token samples."""
    ca, cb = Counter(a), Counter(b)
    keep = [t for t in sorted(set(ca) | set(cb)) if ca[t] + cb[t] >= min_count]
    row_a = [ca[t] for t in keep]
    row_b = [cb[t] for t in keep]
    other_a, other_b = len(a) - sum(row_a), len(b) - sum(row_b)
    if other_a + other_b > 0:
        row_a.append(other_a)
        row_b.append(other_b)
    if len(row_a) < 2:
        return 0.0, 0, 1.0, len(row_a)  # one category only: nothing can differ
    chi2, p, dof, _ = chi2_contingency([row_a, row_b], correction=False)
    return float(chi2), int(dof), float(p), len(row_a)


def compare(prompt_id: str, plain: list[tuple[int, ...]], assisted: list[tuple[int, ...]], *, temperature: float,
            top_p: float, alpha: float = ALPHA) -> SamplingTest:
    positions = []
    for pos in range(len(plain[0])):
        chi2, dof, p, cols = homogeneity([s[pos] for s in plain], [s[pos] for s in assisted])
        positions.append(PositionTest(pos, chi2, dof, p, cols))
    return SamplingTest(prompt_id, temperature, top_p, len(plain), positions, alpha)
