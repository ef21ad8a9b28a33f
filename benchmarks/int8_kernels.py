"""What each CPU linear-layer kernel costs when its weights come from memory, at M = 1..8 tokens.

`python -m harness doctor` times one layer called again and again, so its weights sit in the
cache: that ranks kernels by compute. A decode step reads every layer once, from memory. Here the
same shape is cycled over COPIES distinct layers (about 330 MB in int8), which is what the int8
GEMM choice per CPU class in harness/machine/kernels.py (INT8_KERNEL) rests on.

    python benchmarks/int8_kernels.py                                   # this CPU class
    python benchmarks/int8_kernels.py --skip oneDNN                     # without oneDNN's int8 GEMM
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/int8_kernels.py
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable

import torch

from harness.machine import capability
from quant.layers import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear

TOKENS = (1, 2, 4, 7, 8)


def cold_ms(layers: list[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, repeats: int) -> float:
    """Median over `repeats` passes of the mean ms per layer, every layer called once per pass."""
    for f in layers:
        f(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in layers:
            f(x)
        times.append((time.perf_counter() - t0) / len(layers) * 1e3)
    return statistics.median(times)


def fbgemm_dynamic(weight: torch.Tensor) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        lin.weight.data = weight.clone()
        return quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                dtype=torch.qint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1536x8960", help="in x out features (default: the 1.5B target's MLP)")
    ap.add_argument("--copies", type=int, default=24, help="distinct layers cycled (default 24)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip", nargs="+", default=[], metavar="KERNEL",
                    help="leave out kernels whose name contains one of these words (e.g. oneDNN: on the AMD EPYC "
                         "Zen 4 VM its int8 GEMM ran minutes on one layer without finishing)")
    args = ap.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for _ in range(args.copies)]
    print(f"CPU class {capability.detect().why}")
    print(f"{args.copies} layers of {k}x{n}, ms per layer call with weights from memory; GB/s at M=1")

    def int8(kernel: str):
        layers = [Int8DynamicLinear(w) for w in weights]
        for layer in layers:
            layer.use_kernel(kernel)
        return layers

    kinds = {
        "bf16 matmul": (lambda: [torch.nn.Linear(k, n, bias=False).to(torch.bfloat16) for _ in weights],
                        torch.bfloat16, 2.0),
        "w8af32 oneDNN prepacked": (lambda: int8("onednn"), torch.float32, 1.0),
        "w8af32 torch._int_mm": (lambda: int8("int_mm"), torch.float32, 1.0),
        "w8af32 fbgemm row-scaled": (lambda: int8("fbgemm"), torch.float32, 1.0),
        "w8af32-tensor fbgemm": (lambda: [fbgemm_dynamic(w) for w in weights], torch.float32, 1.0),
        "w8abf16 int8pack": (lambda: [Int8WeightOnlyLinear(w) for w in weights], torch.bfloat16, 1.0),
        "w4abf16 int4pack": (lambda: [Int4WeightOnlyLinear(w) for w in weights], torch.bfloat16, 0.5),
    }
    print(f"{'kernel':26s} " + " ".join(f"{'M=' + str(m):>7s}" for m in TOKENS) + "    GB/s")
    for name, (build, dtype, bytes_per_weight) in kinds.items():
        if any(word.lower() in name.lower() for word in args.skip):
            print(f"{name:26s} left out (--skip)")
            continue
        try:
            with torch.inference_mode():
                layers = build()
                ms = [cold_ms(layers, torch.randn(1, m, k).to(dtype), args.repeats) for m in TOKENS]
        except (RuntimeError, AttributeError, NotImplementedError) as exc:
            print(f"{name:26s} does not run here: {str(exc).splitlines()[0][:80]}")
            continue
        finally:
            layers = None
        print(f"{name:26s} " + " ".join(f"{v:7.3f}" for v in ms) + f"  {n * k * bytes_per_weight / ms[0] / 1e6:6.1f}",
              flush=True)


if __name__ == "__main__":
    main()
