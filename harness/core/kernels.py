"""What a linear layer costs here, per precision and per number of tokens M.

One layer of a given shape is built with random weights in each precision (through quant/, the
same layer classes the models use) and timed at M = 1..8 tokens. The M = K+1 / M = 1 ratio is what
makes assisted decoding pay off or not on a CPU kind: verifying K+1 tokens in one pass must cost
about one token's step (AMX: 0.7x for a bf16 1536x8960 layer; AVX2 kernels: 2x).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

# The kernel behind each precision (int4 RTN stands for AWQ: the same kernel; w8a8 for w8af32).
PROBE_METHOD = {"bf16": None, "fp32": None, "fp16": None, "w8af32": "w8af32", "w8af32-tensor": "w8af32-tensor",
                "w8abf16": "w8abf16", "w8a8": "w8af32", "w4abf16": "w4abf16-rtn", "w4abf16-rtn": "w4abf16-rtn"}


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
    return model.eval(), base


def time_call(fn: Callable[[], object], *, min_seconds: float = 0.15, min_calls: int = 5) -> float:
    """Median milliseconds of `fn` over at least `min_calls` calls and `min_seconds` (after a warm-up)."""
    fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < min_calls or spent < min_seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times) * 1000.0


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
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.debug("%s %s: %s", precision, shape, exc)
        return LayerCost(precision, shape, {}, error=first[:200])
    return LayerCost(precision, shape, ms)


KERNEL = {"bf16": "oneDNN/ATen bf16 matmul", "fp32": "oneDNN/MKL fp32 matmul", "fp16": "ATen fp16 matmul",
          "w8af32": "torch._int_mm (int8 x int8)", "w8af32-tensor": "fbgemm dynamic int8 (torch.ao)",
          "w8abf16": "aten._weight_int8pack_mm", "w8a8": "torch._int_mm (int8 x int8)",
          "w4abf16": "aten._weight_int4pack_mm_for_cpu", "w4abf16-rtn": "aten._weight_int4pack_mm_for_cpu"}


_WORKS: dict[str, str | None] = {}


def failure(precision: str) -> str | None:
    """None when the precision's kernel runs on this CPU, else why not (a 256x256 layer, 2 tokens;
    cached per process)."""
    if precision not in _WORKS:
        probe = layer_cost(precision, 256, 256, tokens=(2,), min_seconds=0.0)
        _WORKS[precision] = probe.error
    return _WORKS[precision]
