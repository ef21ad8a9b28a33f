"""w4abf16 (AWQ): activation-aware weight quantization to 4 bits per group, bf16 activations.
The same search with 6-bit groups is w6a16 (quant/w6a16.py): a `Scheme` says which rounding and layer.

Lin et al. (2023): input channels that see large activations matter more, so scale input channel
j of a weight up by s_j = mean|x_j|^alpha before rounding and divide the activation by s_j.
alpha is searched on a grid in [0, 1] to minimise the output error on calibration rows; alpha = 0
is plain round-to-nearest, so the chosen scale never does worse than RTN on the calibration data.

Where the 1/s goes (`fold=True`, the default, as in the paper and AutoAWQ): for Llama/Qwen2-style
decoder layers (config.model_type in FOLD_ARCHS, model.model.layers[i] with input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj, RMSNorms without
bias) it is folded into the float model before rounding, so the folded int4 layers divide nothing
at run time (input_scale None):

    q, k, v     one scale for the three (loss: their summed output error), 1/s into input_layernorm.weight
    gate, up    one scale for the two, 1/s into post_attention_layernorm.weight
    down        1/s into up_proj's output rows (down's input is act(gate) * up), before up is rounded
    o_proj      its own scale, kept as an in-layer division (`o_proj="divide"`; "rtn": no scale)

o_proj: its input is the attention output; with grouped-query attention v_proj's output (kv heads)
does not match o_proj's input, so nothing precedes it to fold into (AutoAWQ skips it). Measured on
qwen2.5-coder-1.5b (held-out perplexity, 8 windows; plain decode, 2 prompts x 64 tokens; issue 15):

    w4abf16 before (all 7 layers divide)       4.385    6.92 tok/s
    folded, o_proj divides (the default)       4.405   11.50 tok/s  (4.414, 11.09 as a variant below)
    folded, o_proj round-to-nearest            4.426   11.21-11.41 tok/s
    w4abf16-rtn                                4.436   11.29-11.38 tok/s

so the o_proj division keeps about half of what the fold loses against per-layer AWQ, for about 2%
of decode speed (one division per block instead of seven). The rest of the loss is the shared
scales: one alpha for q, k and v whose summed error q's 1536 outputs dominate over k's and v's 256
each (per layer, k and v chose their own). AutoAWQ scores a group by the attention block's / MLP's
output instead; that is not done here.

Order: one calibration pass over the float model gives every group's inputs. A fold is exact in
float (norm(x) / s times W * s is norm(x) times W), so folding one group leaves every other group's
inputs as they were (down_proj's input is act(gate) * up whether or not gate/up were scaled), and a
group's own fold is the (x / s, W * s) the search scored: no second calibration pass is needed. The
only difference is the bf16 rounding of the folded norm and weights (about 2^-9 relative, far
below int4's). All layers are rounded to int4 at the end, from the folded float weights.

Anything else (another architecture or `fold=False`, which a log line names; a group with a member
left out by `skip`): the scale is searched per layer and stays in the layer (`input_scale`, one
division per activation). Not done: the paper's weight-clipping search."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from quant.calibration import TokenWindows, collect_input_stats
from quant.layers import (Int4WeightOnlyLinear, Int6WeightOnlyLinear, QuantSettingsError, check_int4_shape,
                          check_int6_shape, int4_fake_quant, int6_fake_quant)
from quant.rtn import check_head, quantize_head
from quant.walk import linear_layers, replace

log = logging.getLogger(__name__)
FOLD_ARCHS = ("llama", "qwen2")
O_PROJ = ("divide", "rtn")  # o_proj's scale: searched and kept in the layer, or none


@dataclass(frozen=True)
class Scheme:
    """What the weights are rounded to: the rounding the search scores (fake_quant(w, group_size)),
    the shape check, and the layer built at the end."""
    method: str
    bits: int
    fake_quant: Callable[[torch.Tensor, int], torch.Tensor]
    check_shape: Callable[[str, torch.Tensor, int], None]
    layer: type


INT4 = Scheme("w4abf16", 4, int4_fake_quant, check_int4_shape, Int4WeightOnlyLinear)
INT6 = Scheme("w6a16", 6, int6_fake_quant, check_int6_shape, Int6WeightOnlyLinear)


def search_scale(weight: torch.Tensor, x: torch.Tensor, abs_mean: torch.Tensor, group_size: int,
                 grid: int, fake_quant: Callable[[torch.Tensor, int], torch.Tensor] = int4_fake_quant) -> tuple[torch.Tensor, float, float, float]:
    """Best per-input-channel scale for one weight (or several stacked along the output rows, which
    share the input): (scale, alpha, awq loss, rtn loss)."""
    w = weight.detach().float()
    x = x.float()
    ref = x @ w.t()
    best: tuple[float, float, torch.Tensor] | None = None
    rtn_loss = float("nan")
    for i in range(grid + 1):
        alpha = i / grid
        s = abs_mean.float().clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        out = (x / s) @ fake_quant(w * s, group_size).t()
        loss = (out - ref).pow(2).mean().item()
        if i == 0:
            rtn_loss = loss
        if best is None or loss < best[0]:
            best = (loss, alpha, s)
    assert best is not None
    return best[2], best[1], best[0], rtn_loss


@dataclass(frozen=True)
class Group:
    """Linear layers that share one input and one scale, and where its 1/s goes: "norm" (divide
    `prev`'s weight), "rows" (divide `prev`'s output rows), "divide" (in the layer, at run time)
    or "rtn" (no scale)."""
    names: tuple[str, ...]
    kind: str
    prev: str | None = None


def _is_rmsnorm(module: Any, size: int) -> bool:
    w = getattr(module, "weight", None)
    return (isinstance(w, torch.nn.Parameter) and tuple(w.shape) == (size,)
            and getattr(module, "bias", None) is None)


def fold_groups(model: torch.nn.Module, names: list[str], o_proj: str = "divide") -> tuple[list[Group], str | None]:
    """The groups for `names` (the layers to quantize), and why nothing folds (None if it does)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if model_type not in FOLD_ARCHS or not isinstance(blocks, torch.nn.ModuleList):
        return [Group((n,), "divide") for n in names], (f"model_type {model_type!r} is not one of "
                                                         f"{', '.join(FOLD_ARCHS)}")
    wanted = set(names)
    groups: list[Group] = []
    for i, block in enumerate(blocks):
        p = f"model.layers.{i}"
        try:
            attn, mlp = block.self_attn, block.mlp
            lins = {n: getattr(attn, f"{n}_proj") for n in "qkvo"} | {n: getattr(mlp, f"{n}_proj")
                                                                       for n in ("gate", "up", "down")}
            in_norm, post_norm = block.input_layernorm, block.post_attention_layernorm
        except AttributeError as exc:
            return [Group((n,), "divide") for n in names], f"{p}: {exc}"
        hidden = lins["q"].in_features
        if not (_is_rmsnorm(in_norm, hidden) and _is_rmsnorm(post_norm, lins["gate"].in_features)
                and lins["up"].out_features == lins["down"].in_features):
            return [Group((n,), "divide") for n in names], f"{p}: its norms or MLP shapes are not the expected"
        full = {n: f"{p}.{'self_attn' if n in 'qkvo' else 'mlp'}.{n}_proj" for n in lins}

        def group(members: tuple[str, ...], kind: str, prev: str) -> None:
            qualified = tuple(full[m] for m in members)
            if all(n in wanted for n in qualified) and (kind != "rows" or prev in wanted):
                groups.append(Group(qualified, kind, prev))
            else:  # a member (or up_proj) left out of int4: each quantized one keeps its own scale
                groups.extend(Group((n,), "divide") for n in qualified if n in wanted)

        group(("q", "k", "v"), "norm", f"{p}.input_layernorm")
        if full["o"] in wanted:
            groups.append(Group((full["o"],), o_proj))
        group(("gate", "up"), "norm", f"{p}.post_attention_layernorm")
        group(("down",), "rows", full["up"])
    covered = {n for g in groups for n in g.names}
    groups.extend(Group((n,), "divide") for n in names if n not in covered)  # e.g. lm_head if not skipped
    return groups, None


@torch.no_grad()
def search_and_fold(model: torch.nn.Module, groups: list[Group], calibration: TokenWindows, *, group_size: int,
                    grid: int, rows: int, progress: bool = True, scheme: Scheme = INT4) -> tuple[dict[str, torch.Tensor | None], dict]:
    """Search each group's scale and fold it into the float model; returns the input_scale each
    layer keeps (None for folded and round-to-nearest ones) and summary figures."""
    modules = dict(model.named_modules())
    searched = [g for g in groups if g.kind != "rtn"]
    stats = collect_input_stats(model, calibration, [g.names[0] for g in searched], rows=rows, progress=progress)
    scales: dict[str, torch.Tensor | None] = {n: None for g in groups for n in g.names}
    alphas, gains = [], []
    for g in tqdm(searched, desc="AWQ scale search", unit="group", disable=not progress):
        st = stats.pop(g.names[0])
        weight = torch.cat([modules[n].weight for n in g.names])
        s, alpha, loss, rtn = search_scale(weight, st.sample, st.abs_mean, group_size, grid, scheme.fake_quant)
        alphas.append(alpha)
        gains.append(loss / rtn if rtn > 0 else 1.0)
        if g.kind == "divide":
            scales[g.names[0]] = s.to(modules[g.names[0]].weight.dtype)
            continue
        for n in g.names:  # input columns * s
            w = modules[n].weight
            w.copy_((w.float() * s[None, :]).to(w.dtype))
        prev = modules[g.prev]
        if g.kind == "norm":
            prev.weight.copy_((prev.weight.float() / s).to(prev.weight.dtype))
        else:  # "rows": the previous linear's output channels / s
            prev.weight.copy_((prev.weight.float() / s[:, None]).to(prev.weight.dtype))
            if prev.bias is not None:
                prev.bias.copy_((prev.bias.float() / s).to(prev.bias.dtype))
    count = {k: sum(len(g.names) for g in groups if g.kind == k) for k in ("norm", "rows", "divide", "rtn")}
    return scales, {"mean_alpha": sum(alphas) / max(1, len(alphas)),
                    "mean_loss_vs_rtn": sum(gains) / max(1, len(gains)),
                    "folded": count["norm"] + count["rows"], "divided": count["divide"], "rtn": count["rtn"]}


@torch.no_grad()
def _quantize(scheme: Scheme, model: torch.nn.Module, *, calibration: TokenWindows | None = None, group_size: int = 128,
             grid: int = 20, rows: int = 256, skip: tuple[str, ...] = ("lm_head",), lm_head: str = "int8",
             fold: bool = True, o_proj: str = "divide", progress: bool = True) -> tuple[torch.nn.Module, int, dict[str, Any]]:
    if calibration is None:
        raise QuantSettingsError(f"{scheme.method} (AWQ) needs calibration text: pass calibration="
                                 "quant.calibration.token_windows(tokenizer) (models.load does)")
    check_head(lm_head)
    if not 1 <= grid <= 100:
        raise QuantSettingsError(f"grid={grid}: give 1-100 alpha steps (AWQ uses 20)")
    if o_proj not in O_PROJ:
        raise QuantSettingsError(f"o_proj={o_proj!r}: choose {' or '.join(O_PROJ)}")
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:
        scheme.check_shape(name, lin.weight, group_size)
    names = [n for n, _ in layers]
    if fold:
        groups, why_not = fold_groups(model, names, o_proj)
    else:
        groups, why_not = [Group((n,), "divide") for n in names], "fold=False"
    if why_not:
        log.info("AWQ: scales not folded (%s): each layer divides its input at run time", why_not)
    scales, details = search_and_fold(model, groups, calibration, group_size=group_size, grid=grid, rows=rows,
                                      progress=progress, scheme=scheme)
    for name, lin in tqdm(layers, desc=f"int{scheme.bits}", unit="layer", disable=not progress):
        replace(model, name, scheme.layer(lin.weight, lin.bias, group_size=group_size,
                                          input_scale=scales[name], name=name))
    details = {"lm_head": quantize_head(model, lm_head), **details}
    log.info("AWQ (%d-bit): %d layers (%d folded, %d dividing at run time, %d round-to-nearest), mean alpha %.2f, "
             "calibration loss %.2fx of round-to-nearest", scheme.bits, len(layers), details["folded"], details["divided"],
             details["rtn"], details["mean_alpha"], details["mean_loss_vs_rtn"])
    return model, len(layers), {"bits": scheme.bits, "group_size": group_size, "grid": grid, "rows": rows, "skip": list(skip),
                                "fold": fold, "o_proj": o_proj, "calibration": calibration.describe(), **details}


def for_scheme(scheme: Scheme) -> Callable[..., tuple[torch.nn.Module, int, dict[str, Any]]]:
    """`quantize` (its settings and defaults, which quant.settings_of reads) rounding to `scheme`."""
    @functools.wraps(_quantize)  # inspect.signature reads _quantize's keyword settings through __wrapped__
    def quantize_scheme(model: torch.nn.Module, **settings: Any) -> tuple[torch.nn.Module, int, dict[str, Any]]:
        return _quantize(scheme, model, **settings)
    return quantize_scheme


quantize = for_scheme(INT4)
