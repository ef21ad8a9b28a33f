"""What a linear layer costs here, per precision and per number of tokens M.

One layer of a given shape is built with random weights in each precision (through quant/, the
same layer classes the models use) and timed at M = 1..8 tokens. The M = K+1 / M = 1 ratio is what
makes assisted decoding pay off or not on a CPU kind: verifying K+1 tokens in one pass must cost
about one token's step (measured per CPU class: docs/cpu-classes.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from harness.core.timing import median_seconds

log = logging.getLogger(__name__)

# The kernel behind each precision (int4 RTN stands for AWQ: the same kernel; w8a8 for w8af32;
# w8abf16 for w6a16, whose 6-bit groups run through the int8 weight-only kernel).
PROBE_METHOD = {"bf16": None, "fp32": None, "fp16": None, "w8af32": "w8af32", "w8af32-tensor": "w8af32-tensor",
                "w8abf16": "w8abf16", "w8a8": "w8af32", "w4abf16": "w4abf16-rtn", "w4abf16-rtn": "w4abf16-rtn",
                "w6a16": "w8abf16"}


# The int8 GEMM behind w8af32 and w8a8 (quant.layers.INT8_KERNELS) per CPU class, measured on a
# 1536x8960 layer cycled over 12-24 copies so that the weights come from memory
# (benchmarks/int8_kernels.py), ms at M = 1 / 7 tokens:
#   amx (Intel AMX host): oneDNN prepacked 0.70 / 0.75; fbgemm row-scaled 0.74 / 1.01; torch._int_mm 1.32 / 1.36
#   avx2 (the same host, ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2): oneDNN 7.4 / 18.6;
#         torch._int_mm 3.0 / 3.5; fbgemm row-scaled 0.75 / 1.00 (fbgemm picks its kernels from the
#         CPU itself, so this emulation still ran its AVX-512 code)
#   avx2 natively (AMD EPYC Zen 3 VM, no VNNI): fbgemm row-scaled 1.00 / 1.81; torch._int_mm 9.2 / 52.7;
#         oneDNN 16.0 / 46.7; bf16 matmul 2.27 / 11.6
# avx512-bf16 and avx512 were not measured (the emulated run stalled): fbgemm, the x86 int8 library
# built for AVX2 and AVX-512 servers, is the guess there; generic has no AVX2 for fbgemm.
INT8_KERNEL = {"amx": "onednn", "avx512-bf16": "fbgemm", "avx512": "fbgemm", "avx2": "fbgemm", "generic": "int_mm"}
INT8_KERNEL_ENV = "HARNESS_INT8_KERNEL"  # overrides the class's choice (to measure one against the other)
INT8_KERNEL_NAME = {"onednn": "oneDNN int8 GEMM, prepacked", "int_mm": "torch._int_mm (int8 x int8)",
                    "fbgemm": "fbgemm int8 GEMM, row-scaled"}


def int8_kernel() -> str:
    """This process's int8 GEMM: $HARNESS_INT8_KERNEL, else the CPU class's entry in INT8_KERNEL."""
    from harness.machine import capability
    from harness.core.errors import BadInputError
    from quant.layers import INT8_KERNELS

    if chosen := os.environ.get(INT8_KERNEL_ENV):
        if chosen not in INT8_KERNELS:
            raise BadInputError(f"{INT8_KERNEL_ENV}={chosen!r}: choose one of {', '.join(INT8_KERNELS)}, "
                               "or unset it for this CPU class's choice")
        return chosen
    return INT8_KERNEL[capability.detect().name]


def use_int8_kernel(model) -> str | None:
    """Point the model's per-token int8 layers at this process's int8 GEMM; the kernel, or None
    when the model has no such layer."""
    from quant.layers import use_int8_kernel as switch

    kernel = int8_kernel()
    return kernel if switch(model, kernel) else None


@dataclass(frozen=True)
class LayerCost:
    precision: str
    shape: tuple[int, int]          # (in_features, out_features)
    ms: dict[int, float]            # M -> median milliseconds per call
    error: str | None = None        # why this precision's kernel does not run here

    def ratio(self, m: int) -> float:
        """Cost of M tokens in one call relative to one token."""
        return self.ms[m] / self.ms[1]


def build_layer(precision: str, in_features: int, out_features: int, seed: int = 0):
    """A linear layer in `precision` with random weights, and the dtype its input takes."""
    import torch

    import quant

    torch.manual_seed(seed)
    method = PROBE_METHOD.get(precision, precision)
    base = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}.get(precision) or getattr(torch, quant.base_dtype(method))
    model = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).to(base)
    with torch.no_grad():
        model[0].weight.normal_(0, 0.02)
    if method is not None:
        model, _ = quant.quantize(model, method, progress=False)
        use_int8_kernel(model)
    return model.eval(), base


def time_call(fn: Callable[[], object], *, min_seconds: float = 0.15, min_calls: int = 5) -> float:
    """Median milliseconds of `fn` over at least `min_calls` calls and `min_seconds` (after a warm-up)."""
    return median_seconds(fn, min_calls=min_calls, min_seconds=min_seconds) * 1000.0


def layer_cost(precision: str, in_features: int, out_features: int, tokens: tuple[int, ...] = tuple(range(1, 9)),
               *, min_seconds: float = 0.15) -> LayerCost:
    """Median ms per call at each M; a kernel that fails here gives a LayerCost with `error` set."""
    import torch

    shape = (in_features, out_features)
    try:
        layer, dtype = build_layer(precision, in_features, out_features)
        ms = {}
        with torch.inference_mode():
            for m in tokens:
                x = torch.randn(1, m, in_features).to(dtype)
                ms[m] = time_call(lambda: layer(x), min_seconds=min_seconds)
    except (RuntimeError, NotImplementedError, ValueError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.debug("%s %s: %s", precision, shape, exc)
        return LayerCost(precision, shape, {}, error=first[:200])
    return LayerCost(precision, shape, ms)


KERNEL = {"bf16": "oneDNN/ATen bf16 matmul", "fp32": "oneDNN/MKL fp32 matmul", "fp16": "ATen fp16 matmul",
          "w8af32": "per-token int8 GEMM", "w8af32-tensor": "fbgemm dynamic int8 (torch.ao)",
          "w8abf16": "aten._weight_int8pack_mm", "w8a8": "per-token int8 GEMM",  # which one: INT8_KERNEL
          "w4abf16": "aten._weight_int4pack_mm_for_cpu", "w4abf16-rtn": "aten._weight_int4pack_mm_for_cpu",
          "w6a16": "aten._weight_int8pack_mm (6-bit)"}


def kernel_name(precision: str) -> str:
    """The kernel behind a precision in this process (the int8 GEMM as chosen for this CPU class)."""
    if PROBE_METHOD.get(precision) == "w8af32":  # Int8DynamicLinear: the class's int8 GEMM
        return INT8_KERNEL_NAME[int8_kernel()]
    return KERNEL.get(precision, "?")


_WORKS: dict[str, str | None] = {}


def failure(precision: str) -> str | None:
    """None when the precision's kernel runs on this CPU, else why not (a 256x256 layer, 2 tokens;
    cached per process)."""
    if precision not in _WORKS:
        probe = layer_cost(precision, 256, 256, tokens=(2,), min_seconds=0.0)
        _WORKS[precision] = probe.error
    return _WORKS[precision]
