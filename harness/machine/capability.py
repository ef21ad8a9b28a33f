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

import logging
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

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


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first value of each `key: value` in /proc/cpuinfo's text, stripped: the first processor's
    fields, and those said once for all after them (an ARM's `Hardware`)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    return fields


@cache
def _cpuinfo_fields() -> dict[str, str]:
    """/proc/cpuinfo's fields (parse_cpuinfo; {} where it cannot be read): the suite's one reader of
    that file."""
    try:
        with open("/proc/cpuinfo") as fh:
            return parse_cpuinfo(fh.read())
    except OSError:
        return {}


def cpuinfo() -> tuple[str | None, tuple[str, ...]]:
    """The first processor's model name and flags in /proc/cpuinfo (None and () where it cannot be
    read)."""
    fields = _cpuinfo_fields()
    flags = fields.get("flags", fields.get("Features", ""))
    return fields.get("model name"), tuple(flags.split())


def cpu_generation() -> str | None:
    """The first processor's family and model numbers ("family 26 model 2"), None where /proc/cpuinfo
    does not say (not x86): they tell apart hosts that one model name covers (a VM's "AMD EPYC" may
    be Zen 3, 4 or 5)."""
    fields = _cpuinfo_fields()
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']} model {fields['model']}"


def cpu_flags() -> tuple[str, ...]:
    return cpuinfo()[1]


@cache
def detect() -> Capability:
    """This process's class. ATen reads ATEN_CPU_CAPABILITY when torch is imported, so finding it
    takes an import of torch (about 2 s); a process that has not imported torch reads the class
    from a small cache file instead, keyed on everything the answer depends on (`_cache_key`)."""
    if "torch" in sys.modules:
        return _detect_with_torch()
    key = _cache_key()
    if key is not None and (known := _cached(key)) is not None:
        return known
    found = _detect_with_torch()
    if key is not None:
        _remember(key, found)
    return found


def _detect_with_torch() -> Capability:
    import torch

    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: True)())
    return classify(cpu_flags(), torch.backends.cpu.get_cpu_capability(), os.environ, amx_enabled=amx)


# What detect()'s answer depends on besides the CPU flags: the variables ATen and oneDNN read.
_CLASS_ENV = ("ATEN_CPU_CAPABILITY", *ONEDNN_ENV)
_CACHE_VERSION = 1


def _cache_key() -> str | None:
    """The CPU (model and flags), this boot (the OS enables AMX tiles per boot), the torch that
    `import torch` would load (its location and version) and the variables that limit the kernels;
    None where torch cannot be found without importing it."""
    import hashlib
    import importlib.metadata
    import importlib.util
    import json

    try:
        spec = importlib.util.find_spec("torch")
        version = importlib.metadata.version("torch")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    if spec is None or spec.origin is None:
        return None
    model, flags = cpuinfo()
    facts = {"v": _CACHE_VERSION, "model": model, "flags": flags, "boot": _boot_id(), "torch": spec.origin,
             "torch_version": version, "env": {k: os.environ.get(k) for k in _CLASS_ENV}}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _cache_file() -> Path:
    from harness.core.cachedir import cache_root

    return cache_root() / "capability.json"


def _cached(key: str) -> Capability | None:
    """The class remembered under `key`, or None (no file, another key, or a file that does not read)."""
    import json

    try:
        entry = json.loads(_cache_file().read_text())[key]
        return Capability(name=entry["class"], hardware=entry["hardware"], aten=entry["aten"],
                          onednn_limit=entry["onednn_limit"], flags=tuple(entry["flags"]),
                          limited_by=entry["limited_by"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remember(key: str, found: Capability) -> None:
    """Keep `found` under `key` beside the entries of this boot (a file of a few lines, written whole:
    two processes at once may drop each other's entry, which costs one more import of torch)."""
    import json

    from harness.core.jsonio import atomic_write_text

    path, boot = _cache_file(), _boot_id()
    try:
        kept = json.loads(path.read_text())
        kept = {k: v for k, v in kept.items() if isinstance(v, dict) and v.get("boot") == boot}
    except (OSError, ValueError, AttributeError):
        kept = {}
    kept[key] = {**found.as_dict(), "boot": boot}
    try:
        atomic_write_text(path, json.dumps(kept, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        log.debug("capability cache %s not written: %s", path, exc)
