"""The CPU capability class: which matrix kernels torch will really use here.

Assisted decoding pays off when verifying K+1 tokens in one pass costs about one token's step.
That depends on the kernels, not on the CPU model (the measured cost per class: docs/cpu-classes.md).
The registry
(harness/matrix.toml, `[pairs.<name>.per_cpu_class.<class>]`) chooses precisions and K per class.

The class is the lowest of three limits:
- the CPU's flags (/proc/cpuinfo) and what the OS enables (torch.cpu._is_amx_tile_supported);
- ATen's kernels: `torch.backends.cpu.get_cpu_capability()` (follows ATEN_CPU_CAPABILITY);
- oneDNN's ISA limit (ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA), which runs bf16 and fp32 linears.
So `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` selects the avx2 class on any machine.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache

# Best first. Each class is a set of kernels whose M = 1..8 cost curves differ (python -m harness doctor).
CLASSES: tuple[str, ...] = ("amx", "avx512-bf16", "avx512", "avx2", "generic")
DESCRIPTION = {
    "amx": "AMX tiles for bf16/int8 matrix products (Intel Sapphire Rapids and later)",
    "avx512-bf16": "AVX-512 with bf16 dot products, no AMX (e.g. AMD Zen 4, Intel Cooper Lake)",
    "avx512": "AVX-512 without bf16 instructions (e.g. Intel Skylake-SP, Ice Lake): bf16 is converted",
    "avx2": "AVX2 and FMA only (e.g. AMD Zen 3, older Intel): bf16 is converted",
    "generic": "no AVX2: default kernels",
}
ONEDNN_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")

# oneDNN's ISA names (its documented values of ONEDNN_MAX_CPU_ISA) -> the highest class they allow.
_ONEDNN_LIMIT = {
    "SSE41": "generic", "AVX": "generic",
    "AVX2": "avx2", "AVX2_VNNI": "avx2", "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512", "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512-bf16", "AVX512_CORE_FP16": "avx512-bf16",
    "AVX10_1_512": "avx512-bf16",
    "AVX512_CORE_AMX": "amx", "AVX512_CORE_AMX_FP16": "amx", "AVX10_1_512_AMX": "amx",
    "AVX10_1_512_AMX_FP16": "amx", "AVX10_2_512_AMX_2": "amx", "DEFAULT": "amx", "ALL": "amx",
}
_ATEN_LIMIT = {"AVX512": "amx", "AVX2": "avx2"}  # ATen has no AMX kernels of its own: oneDNN's decide


def rank(name: str) -> int:
    """0 for the best class; lower is better."""
    return CLASSES.index(name)


@dataclass(frozen=True)
class Capability:
    """The class and the evidence for it, as `doctor` and `bench` print it."""

    name: str
    hardware: str              # the class the CPU flags alone allow
    aten: str                  # torch.backends.cpu.get_cpu_capability()
    onednn_limit: str | None   # the ONEDNN_MAX_CPU_ISA value in force, if any
    flags: tuple[str, ...]     # the ISA flags that decide the class

    limited_by: str            # which of the three set the class

    @property
    def why(self) -> str:
        limit = f", oneDNN limit {self.onednn_limit}" if self.onednn_limit else ""
        return (f"{self.name}: CPU flags allow {self.hardware}, ATen kernels {self.aten}{limit}; "
                f"set by {self.limited_by}")

    def as_dict(self) -> dict[str, object]:
        return {"class": self.name, "hardware": self.hardware, "aten": self.aten,
                "onednn_limit": self.onednn_limit, "flags": list(self.flags), "limited_by": self.limited_by}


def hardware_class(flags: Collection[str], *, amx_enabled: bool = True) -> str:
    """The best class the CPU's flags allow (AMX also needs the OS to enable its tiles)."""
    f = set(flags)
    avx512 = {"avx512f", "avx512bw", "avx512vl"} <= f
    if avx512 and {"amx_bf16", "amx_tile"} <= f and amx_enabled:
        return "amx"
    if avx512 and "avx512_bf16" in f:
        return "avx512-bf16"
    if avx512:
        return "avx512"
    if {"avx2", "fma"} <= f:
        return "avx2"
    return "generic"


def classify(flags: Collection[str], aten: str, env: Mapping[str, str], *, amx_enabled: bool = True) -> Capability:
    """The class from the CPU flags, ATen's capability string and the environment (testable anywhere)."""
    hardware = hardware_class(flags, amx_enabled=amx_enabled)
    variable = next((k for k in ONEDNN_ENV if env.get(k)), None)
    limit = env[variable] if variable else None
    onednn = _ONEDNN_LIMIT.get(limit.strip().upper(), "amx") if limit else "amx"
    limits = {"the CPU": hardware, f"ATen's capability {aten.upper()}": _ATEN_LIMIT.get(aten.upper(), "generic"),
              f"{variable}={limit}": onednn}
    name = max(limits.values(), key=rank)
    limited_by = next(k for k, v in limits.items() if v == name)
    keep = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_tile",
            "amx_bf16", "amx_int8")
    return Capability(name=name, hardware=hardware, aten=aten.upper(), onednn_limit=limit,
                      flags=tuple(x for x in keep if x in set(flags)), limited_by=limited_by)


@cache
def cpuinfo() -> tuple[str | None, tuple[str, ...]]:
    """The first processor's model name and flags in /proc/cpuinfo (None and () where it cannot be
    read): the suite's one reader of that file."""
    model: str | None = None
    flags: tuple[str, ...] | None = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and flags is None:
                    flags = tuple(value.split())
                if model is not None and flags is not None:
                    break
    except OSError:
        pass
    return model, flags or ()


def cpu_flags() -> tuple[str, ...]:
    return cpuinfo()[1]


@cache
def detect() -> Capability:
    """This process's class (torch is imported: ATen reads ATEN_CPU_CAPABILITY at start-up)."""
    import torch

    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: True)())
    return classify(cpu_flags(), torch.backends.cpu.get_cpu_capability(), os.environ, amx_enabled=amx)
