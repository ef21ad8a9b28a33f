"""Lossless sampling: assisted decoding must keep the target's distribution.

At a fixed prefix, the first `positions` new tokens are sampled many times with and without the
draft (a different seed per sample, disjoint seed ranges for the two arms so that the samples are independent), and for each position the two
histograms are compared with a chi-square test of homogeneity (a 2 x C contingency table; tokens
seen fewer than `min_count` times in both arms together are pooled into one "other" column so that
expected counts stay large enough for the chi-square approximation). The run fails when any
position's p-value is below alpha / positions (Bonferroni). With a correct sampler the test fails
with probability at most alpha; a sampler that leans towards the draft's choices fails it.

The prefix matters: at temperature 0.1 a typical position puts over 99% on one token, both arms then
draw that token every time, and the test is vacuous (one category, nothing can differ).
`contested_prefix` extends the prompt greedily to the first position where the warped distribution
gives its second token at least 10%, so that the test has power at the reference's 0.1 / top-p 0.95.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch
from scipy.stats import chi2_contingency

from harness.core.errors import BadInputError
from harness.workload.decode import DecodeSettings
from harness.measure.generate import ASSISTED, PLAIN, measure_generation

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
                  assistant: torch.nn.Module | None = None, k: int | None = None, positions: int = 2,
                  seed0: int = 0) -> list[tuple[int, ...]]:
    """n samples of the first `positions` new tokens (seeds seed0 .. seed0+n-1); `k`: the draft's K."""
    out = []
    for i in range(n):
        s = dataclasses.replace(settings, seed=seed0 + i, max_new_tokens=positions, min_new_tokens=positions,
                                do_sample=True)
        r = measure_generation(target, ids, s, mode=ASSISTED if assistant is not None else PLAIN,
                               k=k if assistant is not None else None, assistant=assistant)
        out.append(tuple(r.tokens[:positions]))
    return out


@dataclass
class ContestedPrefix:
    """A prefix whose next token is a real draw under the sampling settings (not a near-certainty)."""
    ids: torch.LongTensor
    extended_by: int              # greedy tokens appended to the prompt
    top: list[tuple[int, float]]  # the most likely next tokens and their probabilities after warping


@torch.no_grad()
def next_token_probs(target: torch.nn.Module, ids: torch.LongTensor, temperature: float, top_p: float) -> torch.Tensor:
    """The target's next-token distribution after the temperature and top-p warpers generate() uses."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    logits = target(ids).logits[:, -1, :].float()
    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(ids, logits)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(ids, logits)
    return torch.softmax(logits, dim=-1)[0]


@torch.no_grad()
def contested_prefix(target: torch.nn.Module, ids: torch.LongTensor, settings: DecodeSettings, *,
                     min_second: float = 0.1, max_steps: int = 64) -> ContestedPrefix:
    """Extend `ids` greedily until the warped next-token distribution gives its second token at least
    `min_second`. At temperature 0.1 most positions put over 99% on one token, and a histogram test
    there cannot see a biased sampler: this picks a position where it can."""
    for step in range(max_steps + 1):
        probs = next_token_probs(target, ids, settings.temperature, settings.top_p)
        values, tokens = probs.topk(3)
        if values[1] >= min_second:
            return ContestedPrefix(ids, step, [(int(t), float(v)) for t, v in zip(tokens, values)])
        ids = torch.cat([ids, tokens[:1].view(1, 1)], dim=1)
    raise BadInputError(f"no position in {max_steps} greedy steps gives a second token {min_second:.0%} at "
                     f"temperature {settings.temperature}, top-p {settings.top_p}; use another prompt or more steps")


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
