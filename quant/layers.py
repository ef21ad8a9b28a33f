"""The quantized linear layers and the per-channel / per-group weight quantizers they use.

Each layer keeps its quantized weight as buffers (so `state_dict` saves it) and calls one of
torch's own CPU kernels in `forward`:

    Int8DynamicLinear    int8 weights per output channel, int8 activations per token  oneDNN int8 GEMM
                         (prepacked, AMX) or torch._int_mm: INT8_KERNELS
    Int8WeightOnlyLinear int8 weights per output channel, bf16 activations    aten._weight_int8pack_mm
    Int4WeightOnlyLinear int4 weights per group of input channels, bf16 act.  aten._weight_int4pack_mm_for_cpu
    Int6WeightOnlyLinear 6-bit weights per group, held in int8, bf16 act.     aten._weight_int8pack_mm
    PackedOnceLinear     torch.ao's dynamic int8 Linear (w8af32-tensor), int8 activations per tensor;
                         its weight lives packed for fbgemm, so it saves and restores its own state

`input_scale` (optional, one value per input channel) divides the activations before the
kernel: AWQ and SmoothQuant move per-channel scale from activations into weights this way.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

INT4_GROUP_SIZES = (32, 64, 128, 256)
# The int8 GEMM behind Int8DynamicLinear (harness.machine.kernels.INT8_KERNEL picks one per CPU class,
# with the measurements). "onednn" (weight prepacked once) and "int_mm" give the same exact integer
# products where the CPU has VNNI or AMX. "fbgemm" runs fbgemm's per-tensor dynamic kernel per
# token: each row is divided by its own largest |value| and one constant row [1, -1, 0, ...] is
# appended, so the tensor's range is always [-1, 1] and every row gets the same activation step
# whatever the other rows are. Its activations take the full 8 bits (no reduce_range): with fbgemm's
# 7-bit guard against int16 saturation the 1.5B target's held-out perplexity was 4.349, with 8 bits
# 4.246 (per-token int_mm 4.239, bf16 4.217). Natively on AMD Zen 3 (AVX2, no VNNI), where fbgemm and
# oneDNN add pairs of u8 x s8 products in int16 and saturate on an outlier channel (tests/unit/
# test_presets.py), it was 4.244 with 8 bits and 4.368 with 7: the saturation did not cost the real
# model what the guard does (torch._int_mm is exact there, but 9x slower at one token). All three
# compute a row alone exactly as in a block of K+1 tokens (a saturated sum is inexact, still the
# same per row).
INT8_KERNELS = ("onednn", "int_mm", "fbgemm")


def quantize_per_token(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 activations, one scale per row (token): the int8 values and the scales."""
    a_scale = (a.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    return torch.round(a / a_scale).clamp(-127, 127).to(torch.int8), a_scale

# oneDNN takes a slow path for one token through a narrow layer: a 256x1536 k/v projection cost
# 4.8 ms against 0.04 ms with torch._int_mm on the AMX host (0.5 ms for an 8960-wide one), which
# made a whole one-token step of the 1.5B target 3x slower than 9 tokens. Layers narrower than this
# stay on torch._int_mm, whose integer products are the same where oneDNN is chosen.
ONEDNN_MIN_OUT = 1024
INT4_INNER_K_TILES = 2  # torch's CPU int4 packing: in_features must be a multiple of 16 * this


class QuantSettingsError(ValueError):
    """A setting or a layer shape that a quantization method cannot handle."""


# ---------------------------------------------------------------------------------------------
# Weight quantizers (pure functions, float in, integers + scales out)
# ---------------------------------------------------------------------------------------------
def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: weight ~ q * scale[:, None], q in [-127, 127]."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int4_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of `group_size` input channels (gpt-fast's convention, the one
    torch's int4 kernel dequantizes with: w = (q - 8) * scale + zero, q in [0, 15]).
    Returns q [N, K] int32, scale [N, K/g], zero [N, K/g] (float32)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    q = torch.round((w - lo[..., None]) / scale[..., None]).clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scale, lo + scale * 8


def int4_dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = q.shape
    w = (q.reshape(n, k // group_size, group_size).float() - 8) * scale[..., None] + zero[..., None]
    return w.reshape(n, k)


def int4_fake_quant(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Quantize then dequantize: the float weight the int4 layer computes with (AWQ's search)."""
    return int4_dequantize(*int4_groups(weight, group_size), group_size)


# 6-bit groups on the int8 kernel: each weight is q * m_g * u with q in [-31, 31] (6 bits), u one
# step per output row and m_g in 1..INT6_MULTIPLIERS per group (a 2-bit group scale on top of the
# row's, as llama.cpp's k-quants quantize their sub-block scales). q * m_g fits an int8 (|31 * 4| <=
# 127), so aten._weight_int8pack_mm, whose scales are per row only, computes the grouped 6-bit
# weights exactly. The bytes read per token are int8's: it is w8abf16's speed at 6-bit accuracy.
INT6_LEVELS = 31
INT6_MULTIPLIERS = 4


def int6_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 6-bit per group of `group_size` input channels, as an int8 weight and a row step:
    returns (q * m [N, K] int8, u [N] bf16), weight ~ (q * m) * u[:, None]."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    group_step = (w.abs().amax(dim=-1) / INT6_LEVELS).clamp(min=1e-8)      # the ideal 6-bit step per group
    row_step = (group_step.amax(dim=-1) / INT6_MULTIPLIERS).to(torch.bfloat16)  # what the kernel multiplies by
    u = row_step.float()[:, None]
    # the smallest multiplier whose step covers the group's range (no clipping), at most 4
    m = torch.ceil(group_step / u - 1e-4).clamp(1, INT6_MULTIPLIERS)
    q = torch.round(w / (m * u)[..., None]).clamp(-INT6_LEVELS, INT6_LEVELS)
    return (q * m[..., None]).reshape(n, k).to(torch.int8), row_step


def int6_fake_quant(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float weight an Int6WeightOnlyLinear computes with (AWQ's search)."""
    q, row_step = int6_groups(weight, group_size)
    return q.float() * row_step.float()[:, None]


def check_int6_shape(name: str, weight: torch.Tensor, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise QuantSettingsError(f"group_size={group_size}: w6a16 takes {', '.join(map(str, INT4_GROUP_SIZES))}; "
                                 "128 is the reference's")
    if weight.shape[1] % group_size:
        raise QuantSettingsError(f"layer {name!r}: in_features {weight.shape[1]} is not a multiple of group_size "
                                 f"{group_size}; skip the layer (skip=[...]) or choose a group size that divides it")


def check_int4_shape(name: str, weight: torch.Tensor, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise QuantSettingsError(f"group_size={group_size}: torch's CPU int4 kernel takes "
                                 f"{', '.join(map(str, INT4_GROUP_SIZES))}; 128 is the reference's")
    n, k = weight.shape
    if k % group_size or k % (16 * INT4_INNER_K_TILES):
        raise QuantSettingsError(f"layer {name!r}: in_features {k} is not a multiple of group_size "
                                 f"{group_size} (and of {16 * INT4_INNER_K_TILES}); skip the layer "
                                 f"(skip=[...]) or choose a group size that divides {k}")


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------
class _QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None,
                 input_scale: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("input_scale", None if input_scale is None else input_scale.detach().clone())

    def _scaled(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x = x.reshape(-1, self.in_features).to(dtype)
        return x if self.input_scale is None else x / self.input_scale.to(dtype)

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"input_scale={self.input_scale is not None}")

    def saved_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of the layer: its buffers."""
        return self.state_dict()

    @classmethod
    def restored(cls, meta: dict, state: dict[str, torch.Tensor]) -> "_QuantLinear":
        """The layer rebuilt from its saved buffers, without the float weight."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = meta["in_features"], meta["out_features"]
        if meta.get("group_size") is not None:
            layer.group_size = meta["group_size"]
        for key in ("bias", "input_scale"):
            layer.register_buffer(key, None)
        for key, value in state.items():
            layer.register_buffer(key, value)
        return layer


class Int8DynamicLinear(_QuantLinear):
    """w8a8 compute: each token's activations get their own int8 scale, so a block of K+1
    verified tokens computes every row exactly as one token alone would."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 input_scale: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias, input_scale)
        w = weight.detach().float() * (1 if input_scale is None else input_scale.float()[None, :])
        q, scale = int8_per_channel(w)
        self.register_buffer("weight_q", q)  # [N, K]; passed transposed (a column-major view): on this
        # CPU torch._int_mm ran twice as fast with that layout as with a contiguous [K, N] copy
        self.register_buffer("weight_scale", scale)

    kernel = "int_mm"  # or "onednn" after use_kernel("onednn"); see INT8_KERNELS

    def use_kernel(self, kernel: str) -> None:
        """Switch the int8 GEMM. "onednn" prepacks the weight into oneDNN's blocked layout once
        (a second int8 copy; `weight_q` stays for state_dict) and calls its int8 GEMM with unit
        scales, so its float32 output is the exact int32 product, as with torch._int_mm."""
        if kernel not in INT8_KERNELS:
            raise QuantSettingsError(f"int8 kernel {kernel!r}: choose one of {', '.join(INT8_KERNELS)}")
        if kernel == "onednn" and self.out_features < ONEDNN_MIN_OUT:
            kernel = "int_mm"  # oneDNN's slow path for narrow layers; the products are the same (see above)
        if kernel == "onednn":
            self._packed = torch.ops.onednn.qlinear_prepack(self.weight_q, [1, self.in_features])
            self._unit = torch.ones(self.out_features)
            self._zero = torch.zeros(self.out_features, dtype=torch.int32)
        elif kernel == "fbgemm":
            # fbgemm's prepack takes only a quantized tensor, whose creation torch 2.13 warns is deprecated
            # (one warning per process in every log); the kernel is this torch's, so the warning is noted here
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.quantize_per_tensor", category=UserWarning)
                w = torch._make_per_channel_quantized_tensor(self.weight_q, self.weight_scale.double(),
                                                             torch.zeros(self.out_features, dtype=torch.long), 0)
            self._packed = torch.ops.quantized.linear_prepack(w, None)
            self._range_row = torch.zeros(1, self.in_features)
            self._range_row[0, :2] = torch.tensor([1.0, -1.0])
        else:
            self._packed = None
        self.kernel = kernel

    def _int8_gemm(self, a_q: torch.Tensor) -> torch.Tensor:
        if self.kernel == "onednn":
            return torch.ops.onednn.qlinear_pointwise(a_q, 1.0, 0, self._packed, self._unit, self._zero, None,
                                                      1.0, 0, torch.float32, "none", [], "")
        return torch._int_mm(a_q, self.weight_q.t()).float()

    def _fbgemm_rows(self, a: torch.Tensor) -> torch.Tensor:
        peak = a.abs().amax(dim=1, keepdim=True).clamp(min=1e-8)
        y = torch.ops.quantized.linear_dynamic(torch.cat([a / peak, self._range_row]), self._packed, False)
        return y[:-1] * peak

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self._scaled(x, torch.float32)
        if self.kernel == "fbgemm":
            return self._finish(self._fbgemm_rows(a), x)
        a_q, a_scale = quantize_per_token(a)
        y = self._int8_gemm(a_q) * a_scale * self.weight_scale
        return self._finish(y, x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kernel={self.kernel}"


class Int8WeightOnlyLinear(_QuantLinear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias, None)
        q, scale = int8_per_channel(weight)
        self.register_buffer("weight_q", q)
        self.register_buffer("weight_scale", scale.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(self._scaled(x, torch.bfloat16), self.weight_q, self.weight_scale)
        return self._finish(y, x)


class Int4WeightOnlyLinear(_QuantLinear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, group_size: int = 128,
                 input_scale: torch.Tensor | None = None, name: str = "linear") -> None:
        check_int4_shape(name, weight, group_size)
        super().__init__(weight.shape[1], weight.shape[0], bias, input_scale)
        self.group_size = group_size
        w = weight.detach().float() * (1 if input_scale is None else input_scale.float()[None, :])
        q, scale, zero = int4_groups(w, group_size)
        self.register_buffer("weight_packed",
                             torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES))
        # [K/g, N, 2] bf16, the kernel's layout
        self.register_buffer("scales_and_zeros",
                             torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(self._scaled(x, torch.bfloat16), self.weight_packed,
                                                       self.group_size, self.scales_and_zeros)
        return self._finish(y, x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"


class Int6WeightOnlyLinear(Int8WeightOnlyLinear):
    """6-bit grouped weights (int6_groups) in Int8WeightOnlyLinear's buffers and kernel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, group_size: int = 128,
                 input_scale: torch.Tensor | None = None, name: str = "linear") -> None:
        check_int6_shape(name, weight, group_size)
        _QuantLinear.__init__(self, weight.shape[1], weight.shape[0], bias, input_scale)
        self.group_size = group_size
        w = weight.detach().float() * (1 if input_scale is None else input_scale.float()[None, :])
        q, row_step = int6_groups(w, group_size)
        self.register_buffer("weight_q", q)
        self.register_buffer("weight_scale", row_step)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}, bits=6"


def use_int8_kernel(model: nn.Module, kernel: str) -> int:
    """Point every Int8DynamicLinear of `model` at one int8 GEMM; the number of layers switched."""
    layers = [m for m in model.modules() if isinstance(m, Int8DynamicLinear)]
    for layer in layers:
        layer.use_kernel(kernel)
    return len(layers)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", category=DeprecationWarning)  # torch.ao is deprecated, still shipped
    from torch.ao.nn.quantized.dynamic import Linear as _DynamicLinear


class PackedOnceLinear(_DynamicLinear):
    """torch's dynamic int8 Linear without the prepack of an empty full-size weight that its
    constructor makes before `from_float` packs the real one (fbgemm packs at about 60-120 MB/s on
    one thread: for the 0.5B draft's 494 MB, seconds of every load). The real weight is packed by
    the same call as before, so the layer computes exactly what torch's own does.

    A layer restored from a checkpoint holds its int8 weight unpacked until it is first called
    (`packed`): the fused draft loop packs q, k, v and gate, up together from the unpacked weights
    (harness/workload/fused_draft.py `fuse`), so those are packed once, not on load and again."""

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, dtype: torch.dtype = torch.qint8) -> None:
        super().__init__(1, 1, bias_, dtype=dtype)  # a 1x1 placeholder, replaced by set_weight_bias
        self.in_features, self.out_features = in_features, out_features
        self._held: tuple[torch.Tensor, torch.Tensor | None] | None = None  # restored, not packed yet

    def set_weight_bias(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self._held = None
        super().set_weight_bias(weight, bias)

    def packed(self) -> Any:
        """fbgemm's packed weight (what `torch.ops.quantized.linear_dynamic` takes), packing a held one now."""
        if self._held is not None:
            self.set_weight_bias(*self._held)
        return self._packed_params._packed_params

    def _weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The quantized weight and the bias, without packing a held weight (unpacking a packed one copies it)."""
        return self._held if self._held is not None else super()._weight_bias()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.packed()
        return super().forward(x)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        self.packed()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def saved_state(self) -> dict[str, torch.Tensor]:  # as _QuantLinear's: the weight is not a buffer here
        """Its int8 weight with its scales and zero points (per output channel or per tensor) and its
        bias, as plain tensors: what a checkpoint read with weights_only holds."""
        weight, bias = self._weight_bias()
        if weight.qscheme() == torch.per_channel_affine:
            scale, zero = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
        else:
            scale, zero = torch.tensor(weight.q_scale(), dtype=torch.float64), torch.tensor(weight.q_zero_point())
        return {"weight_q": weight.int_repr(), "weight_scale": scale, "weight_zero": zero,
                **({"bias": bias} if bias is not None else {})}

    @classmethod
    def restored(cls, meta: dict, state: dict[str, torch.Tensor]) -> "PackedOnceLinear":
        layer = cls(meta["in_features"], meta["out_features"], bias_="bias" in state)
        scale, zero = state["weight_scale"], state["weight_zero"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)  # torch 2.13 notes quantized tensors as deprecated
            if scale.ndim:
                weight = torch._make_per_channel_quantized_tensor(state["weight_q"], scale, zero, 0)
            else:
                weight = torch._make_per_tensor_quantized_tensor(state["weight_q"], float(scale), int(zero))
        layer._held = (weight, state.get("bias"))
        return layer


LAYER_CLASSES = {c.__name__: c for c in (Int8DynamicLinear, Int8WeightOnlyLinear, Int4WeightOnlyLinear,
                                         Int6WeightOnlyLinear, PackedOnceLinear)}


def layer_meta(layer: nn.Module) -> dict:
    return {"class": type(layer).__name__, "in_features": layer.in_features,
            "out_features": layer.out_features, "group_size": getattr(layer, "group_size", None)}


def restore_layer(meta: dict, state: dict[str, torch.Tensor]) -> nn.Module:
    """Rebuild a saved quantized layer (`saved_state` wrote `state`), without the float weight."""
    return LAYER_CLASSES[meta["class"]].restored(meta, state)
