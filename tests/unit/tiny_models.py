"""Tiny random-weight models of the seeds' architectures, built in the test (no downloads)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig, Qwen2Config

VOCAB = 96
ARCHITECTURES = ("opt", "llama", "qwen2")


def tiny_config(arch: str, *, layers: int = 2, hidden: int = 64):
    common = dict(vocab_size=VOCAB, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=4,
                  max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "opt":
        return OPTConfig(ffn_dim=hidden * 2, word_embed_proj_dim=hidden, **common)
    if arch == "llama":
        return LlamaConfig(intermediate_size=hidden * 2, num_key_value_heads=2, **common)
    if arch == "qwen2":
        return Qwen2Config(intermediate_size=hidden * 2, num_key_value_heads=2, **common)
    raise ValueError(arch)


def tiny_model(arch: str, seed: int, **kwargs) -> torch.nn.Module:
    """A random model whose greedy continuations are not degenerate (scaled-up logits)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs), dtype=torch.float32).eval()
    # never stop early: the counters are compared over full-length generations
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompt(seed: int = 0, length: int = 12) -> torch.LongTensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g)
