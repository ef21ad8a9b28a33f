"""The draft's decode loop without transformers' `generate` (`--fused-draft`, issue: a draft step at
half its cost).

A draft step of the default pair's 0.5B draft spends about 60% of its time in its int8 GEMMs and the
rest in what surrounds them: about 1,700 small operator calls a step through transformers' layers
and cache, and `generate`'s own work for each drafted token (logits processors, stopping criteria,
cache bookkeeping); benchmarks/draft_step.py measures the split. Here the same weights run in a
loop of a few dozen lines, in the manner of gpt-fast:

  - the linear layers that read the same input are one call: q, k and v; gate and up. For torch's
    dynamically quantized int8 layers (`w8af32-tensor`) the int8 rows and their per-channel scales
    are concatenated and packed once; the activations are quantized once per call with one scale
    either way, so the fused call computes exactly what the separate ones did;
  - the KV cache is a preallocated tensor per layer, written in place and read as a view: no
    concatenation per step, and dropping rejected tokens is setting a length;
  - drafting K tokens is a Python loop of argmax and forward, nothing else;
  - fewer operator calls a step (each costs a few microseconds of dispatch): a float32 RMSNorm is one
    `F.rms_norm`, queries and keys get their rotary embedding in one pass, int8 layers are called
    through their op. The logits stay bit-identical to the loop without these; the step's
    measured cost before and after is in docs/cpu-classes.md (amx natively).

The draft only proposes: the target verifies every token, so the output is the target's whatever
the draft computes. What must hold is that this loop proposes what the draft model would (its
logits equal transformers' within float rounding, tested on tiny models of each supported
architecture), or acceptance would fall.

A step drafts K tokens, or with a confidence threshold (`--confidence-threshold`, transformers'
`assistant_confidence_threshold`) ends after the first drafted token whose probability under the
draft is below it: the draft stops where it has become unsure (benchmarks/draft_stop.py replays
stopping rules over the draft's proposals at every position of a text).

Supported: decoder-only models built of RMSNorm, rotary attention (grouped-query) and a gated MLP
(transformers' Llama and Qwen2 families, the suite's drafts); greedy decoding with a constant K (and
optionally a confidence threshold). The selection refuses the rest in one line (harness/workload/selection.py).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.generation.candidate_generator import CandidateGenerator

from quant.layers import PackedOnceLinear

log = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "qwen2")  # config.model_type values whose layers this loop reproduces


def _dynamic_int8(module: nn.Module) -> bool:
    """torch's dynamically quantized Linear (torch.ao.nn.quantized.dynamic.Linear) with int8 weights."""
    packed = getattr(module, "_packed_params", None)
    return packed is not None and getattr(packed, "dtype", None) == torch.qint8


class _Int8Op(nn.Module):
    """torch's dynamic int8 GEMM on packed weights (fbgemm on x86): what torch.ao's dynamic Linear
    calls, without its checks."""

    def __init__(self, packed: Any) -> None:
        super().__init__()
        self._packed = packed
        # what torch.ao's dynamic Linear passes (reduce_range: fbgemm's 7-bit activations on x86)
        self._reduce_range = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed, reduce_range=self._reduce_range)


def _packed_int8(unpacked: list[tuple[torch.Tensor, torch.Tensor | None]]) -> _Int8Op:
    """Several dynamically quantized int8 layers with per-channel weight scales as one: their int8
    rows, scales and biases (`unpacked`: each layer's (weight, bias)) concatenated and packed for
    fbgemm once."""
    rows, scales, zeros, biases = [], [], [], []
    for weight, bias in unpacked:
        rows.append(weight.int_repr())
        scales.append(weight.q_per_channel_scales())
        zeros.append(weight.q_per_channel_zero_points())
        biases.append(bias if bias is not None else torch.zeros(weight.shape[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # torch 2.13 notes quantized tensors as deprecated
        weight = torch._make_per_channel_quantized_tensor(torch.cat(rows), torch.cat(scales), torch.cat(zeros), 0)
        return _Int8Op(torch.ops.quantized.linear_prepack(weight, torch.cat(biases).float()))


class _Concatenated(nn.Module):
    """Layers that cannot be packed together (other kinds): called one after the other."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self.parts], dim=-1)


def fuse(layers: list[nn.Module]) -> nn.Module:
    """One module computing the layers' outputs side by side (they read the same input)."""
    if all(type(layer) is nn.Linear for layer in layers) and len({layer.weight.dtype for layer in layers}) == 1:
        weight = torch.cat([layer.weight.detach() for layer in layers])
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=any(layer.bias is not None for layer in layers),
                          dtype=weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(weight)
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([layer.bias.detach() if layer.bias is not None else
                                            torch.zeros(layer.out_features, dtype=weight.dtype) for layer in layers]))
        return fused.eval()
    if all(_dynamic_int8(layer) for layer in layers):
        # read once, for the check and the packing: unpacking a packed weight copies it whole (a layer
        # restored from a checkpoint holds it unpacked, quant/layers.py PackedOnceLinear)
        unpacked = [layer._weight_bias() for layer in layers]
        if all(weight.qscheme() == torch.per_channel_affine for weight, _ in unpacked):
            return _packed_int8(unpacked)
    return _Concatenated(layers)


def direct(layer: nn.Module) -> nn.Module:
    """The layer, or for a dynamically quantized int8 one, its op without the layer's checks."""
    if not _dynamic_int8(layer):
        return layer
    return _Int8Op(layer.packed() if isinstance(layer, PackedOnceLinear) else layer._packed_params._packed_params)


class _RMSNorm(nn.Module):
    """The model's RMSNorm as one operator (F.rms_norm) where activations are float32: the same
    formula, x / sqrt(mean(x^2) + eps) * weight, in one call instead of eight."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon
        self.shape = (norm.weight.shape[0],)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)


def rms_norm(norm: nn.Module) -> nn.Module:
    """One operator for a float32 RMSNorm; in lower precisions the model's own (it rounds to the
    activations' dtype before scaling by the weight)."""
    return _RMSNorm(norm) if norm.weight.dtype == torch.float32 and hasattr(norm, "variance_epsilon") else norm


class _Layer(nn.Module):
    def __init__(self, layer: nn.Module, hidden_act: str | None) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.norm_in, self.norm_post = rms_norm(layer.input_layernorm), rms_norm(layer.post_attention_layernorm)
        self.head_dim = attn.head_dim
        self.qkv = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = direct(attn.o_proj)
        self.scaling = attn.scaling
        self.gate_up = fuse([mlp.gate_proj, mlp.up_proj])
        self.down = direct(mlp.down_proj)
        self.act = F.silu if hidden_act == "silu" else mlp.act_fn  # transformers' "silu" is F.silu


class FusedDraft(nn.Module):
    """A draft model's forward pass over its own static KV cache. `forward(ids)` feeds the tokens
    (shape (1, n)) at the cache's current length and returns the last position's logits (1, vocab);
    `length` is how many tokens the cache holds (set it lower to drop tokens)."""

    def __init__(self, model: nn.Module, capacity: int = 1024) -> None:
        super().__init__()
        config = model.config
        if config.model_type not in ARCHITECTURES:
            raise ValueError(f"the fused draft loop runs {', '.join(ARCHITECTURES)} models; this draft is "
                             f"{config.model_type!r}")
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", False):
            raise ValueError("the fused draft loop has no sliding-window attention; this draft uses it")
        inner = model.model
        self.embed, self.norm, self.head = inner.embed_tokens, rms_norm(inner.norm), direct(model.get_output_embeddings())
        self.rotary = inner.rotary_emb
        self.layers = nn.ModuleList(_Layer(layer, getattr(config, "hidden_act", None)) for layer in inner.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = self.layers[0].head_dim
        self.dtype, self.device = self.embed.weight.dtype, self.embed.weight.device
        self.length = 0
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        shape = (1, self.kv_heads, capacity, self.head_dim)
        old, self._cache = self._cache, [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                                          torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.layers]
        for (k_old, v_old), (k_new, v_new) in zip(old, self._cache):
            k_new[:, :, :self.length] = k_old[:, :, :self.length]
            v_new[:, :, :self.length] = v_old[:, :, :self.length]
        self.capacity = capacity

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        start, n = self.length, input_ids.shape[1]
        end = start + n
        if end > self.capacity:
            self._grow(max(end, 2 * self.capacity))
        x = self.embed(input_ids)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        cos, sin = self.rotary(x, positions)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (1, n, 1, head_dim): every head at once
        # n > 1 (catching up after a verification): each new token sees the cache and the new tokens before it
        mask = (torch.arange(end, device=self.device)[None, :] <= positions[0, :, None]) if n > 1 else None
        heads, qk_heads, half = self.heads, self.heads + self.kv_heads, self.head_dim // 2
        for layer, (k_cache, v_cache) in zip(self.layers, self._cache):
            qkv = layer.qkv(layer.norm_in(x)).view(1, n, qk_heads + self.kv_heads, self.head_dim)
            # the rotary embedding of queries and keys together, as the models compute it for each:
            # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
            qk = qkv[:, :, :qk_heads]
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
            q = qk[:, :, :heads].transpose(1, 2)
            k_cache[:, :, start:end] = qk[:, :, heads:].transpose(1, 2)
            v_cache[:, :, start:end] = qkv[:, :, qk_heads:].transpose(1, 2)
            attn = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask,
                                                  scale=layer.scaling, enable_gqa=self.kv_heads != self.heads)
            x = x + layer.o_proj(attn.transpose(1, 2).reshape(1, n, heads * self.head_dim))
            gate, up = layer.gate_up(layer.norm_post(x)).chunk(2, dim=-1)
            x = x + layer.down(layer.act(gate) * up)
        self.length = end
        return self.head(self.norm(x[:, -1:]))[:, -1].float()


def fused(model: nn.Module) -> FusedDraft:
    """The model's fused loop, built once per loaded model (the packed weights are kept beside it)."""
    loop = model.__dict__.get("_harness_fused_draft")
    if loop is None:
        loop = FusedDraft(model).eval()
        model.__dict__["_harness_fused_draft"] = loop
        log.info("fused draft loop built for %s", type(model).__name__)
    return loop


class FusedDraftGenerator(CandidateGenerator):
    """transformers' candidate generator with the fused loop as the draft: up to K greedy tokens a
    step. The cache keeps what it computed for the longest prefix it shares with the text."""

    def __init__(self, loop: FusedDraft, *, k: int, max_length: int, eos_token_id: torch.Tensor | None,
                 confidence: float = 0.0) -> None:
        self.loop, self.num_assistant_tokens, self.main_model_max_length = loop, k, max_length
        # transformers' assistant_confidence_threshold: a step ends after a drafted token whose probability
        # under the draft is below it (fixed: transformers adapts it only where scikit-learn is installed)
        self.confidence = confidence
        self.eos = set(eos_token_id.tolist()) if eos_token_id is not None else set()
        self.held = torch.zeros(0, dtype=torch.long)  # the tokens whose keys and values the cache holds
        loop.length = 0

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs: Any) -> tuple[torch.LongTensor, None]:
        n = input_ids.shape[1]
        room = min(self.num_assistant_tokens, self.main_model_max_length - n - 1)
        if room <= 0:
            return input_ids, None
        ids = input_ids[0].cpu()
        # keep the cache for the prefix it shares with the text, but as transformers' draft does, never
        # its last two tokens: with per-tensor activation scales (w8af32-tensor) the tokens fed together
        # change what is computed, and the same blocks make the same proposals
        m = min(self.held.shape[0], n - 2)
        differs = (self.held[:m] != ids[:m]).nonzero()
        shared = int(differs[0]) if differs.numel() else max(m, 0)
        self.loop.length = shared
        logits = self.loop(ids[shared:].unsqueeze(0).to(self.loop.device))
        drafted: list[int] = []
        while True:
            token = int(logits.argmax(-1))
            drafted.append(token)
            if len(drafted) == room or token in self.eos or (
                    self.confidence and float((logits[0, token] - logits[0].logsumexp(-1)).exp()) < self.confidence):
                break
            logits = self.loop(torch.tensor([[token]], device=self.loop.device))
        self.held = torch.cat([ids, torch.tensor(drafted[:-1], dtype=torch.long)])
        candidates = torch.tensor([drafted], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat([input_ids, candidates], dim=1), None

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        pass  # a constant K and a fixed threshold (the selection refuses a schedule with --fused-draft)
