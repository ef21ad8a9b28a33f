"""A draft whose output layer scores only its N most frequent tokens (frequency-ranked draft heads,
as in FR-Spec: Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling").

Why: a draft step reads every weight once, and the output layer is a large share of a small draft
with a large vocabulary (Qwen2.5-0.5B: 151,936 x 896 = 136M of its 494M parameters). Scoring the
32,768 most frequent tokens instead cuts that layer by 78%. The target still scores every token,
so the output is unchanged: greedy verification keeps the target's argmax, and speculative
sampling stays exact for any draft distribution (a token outside the subset has draft probability
0 and is never proposed). Only acceptance can fall, where the target's token is outside the subset.

Ranking: token counts in the calibration text (quant/corpus.toml [calibration]: Python sources and
documentation), then, for tokens never seen there, token id (byte-pair vocabularies number their
tokens roughly in the order their merges were learned, most frequent first). Special tokens are
always kept. The subset is applied before quantization, so the smaller layer is quantized as usual.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


class SubsetHead(nn.Module):
    """An output layer over `keep` token ids; the other logits are the dtype's lowest value."""

    def __init__(self, head: nn.Linear, keep: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.register_buffer("keep", keep.clone())
        self.linear = nn.Linear(head.in_features, len(keep), bias=head.bias is not None,
                                dtype=head.weight.dtype, device=head.weight.device)
        with torch.no_grad():
            self.linear.weight.copy_(head.weight[keep])
            if head.bias is not None:
                self.linear.bias.copy_(head.bias[keep])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.linear(hidden)
        out = scores.new_full((*scores.shape[:-1], self.vocab), torch.finfo(scores.dtype).min)
        return out.index_copy_(-1, self.keep, scores)

    def extra_repr(self) -> str:
        return f"tokens={len(self.keep)} of {self.vocab}"


def ranked_tokens(tokenizer: Any, vocab: int) -> torch.Tensor:
    """Every token id below `vocab`, most frequent first (see the module docstring)."""
    from quant.calibration import corpus_text

    ids = tokenizer(corpus_text("calibration"), add_special_tokens=False)["input_ids"]
    counts = torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab)[:vocab]
    special = [i for i in getattr(tokenizer, "all_special_ids", []) if 0 <= i < vocab]
    counts[special] = counts.max() + 1
    # stable sort by descending count: ties (and the unseen tokens) stay in id order
    return torch.sort(-counts, stable=True).indices


def restrict_head(model: nn.Module, tokenizer: Any, n: int) -> dict[str, Any]:
    """Swap the model's output layer for a SubsetHead over its `n` top-ranked tokens (before
    quantizing it). Returns what was done, for the results."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        raise ValueError(f"the draft's output layer is {type(head).__name__}, not a plain linear layer: "
                         "restrict it before quantizing")
    vocab = head.out_features
    if not 1 <= n < vocab:
        raise ValueError(f"draft vocabulary {n}: give 1..{vocab - 1} (the model has {vocab} tokens)")
    keep = torch.sort(ranked_tokens(tokenizer, vocab)[:n]).values
    model.config.tie_word_embeddings = False  # the subset is its own layer now; the embedding is unchanged
    model.set_output_embeddings(SubsetHead(head, keep, vocab))
    log.info("draft output layer: %d of %d tokens (frequency-ranked)", n, vocab)
    return {"draft_vocab": n, "vocab": vocab}
