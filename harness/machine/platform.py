"""Detect the machine: device, CPU/GPU model, capability class, cores -> a platform id; and the
software versions that are recorded beside a baseline.

The id keys the per-platform baselines: `<device>-<cpu or gpu model>-<class>-<N>c`, e.g.
`cpu-intel-xeon-processor-amx-2c`. It is made of the hardware alone:
- the device, the CPU (or GPU) model and the core count;
- the CPU capability class (harness/machine/capability.py): the ISA flags that matter, as the kernels
  torch will really use, so a run restricted to AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2
  ATEN_CPU_CAPABILITY=avx2) on an AMX machine is a platform of its own with its own file.
There is no hash of a longer fingerprint. The flags that change kernels are the class, already in
the id; a hash of the whole flag list would make a hypervisor that shows one more flag (or a
microcode update) a new platform with no baseline, the failure the version hash had. Two hosts
whose models share a slug (a VM that reports "Intel Xeon Processor" for several generations) are
told apart by the host-speed probe (harness/machine/hostspeed.py) that every baseline records, which
is what matters for comparing their numbers.

Software versions (python, torch, transformers, oneDNN, MKL, CUDA) are not in the id: they are
recorded beside each baseline (`software()`), and a change is named when a run is compared.
"""

from __future__ import annotations

import os
import platform as _platform
import re
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

SLUG_CHARS = 40


@dataclass(frozen=True)
class PlatformInfo:
    device: str
    cpu_model: str
    cpu_count: int
    torch_threads: int
    gpu_name: str | None
    python: str
    torch: str
    transformers: str
    machine: str
    isa: tuple[str, ...]
    capability: str = "generic"  # harness/machine/capability.py CLASSES

    @property
    def id(self) -> str:
        return platform_id(self.device, self.cpu_model, self.gpu_name, self.capability, self.cpu_count)

    def hardware(self) -> dict[str, Any]:
        """The `platform` section of a baseline file: the machine, no software versions."""
        return {"id": self.id, "device": self.device, "cpu_model": self.cpu_model, "cpu_count": self.cpu_count,
                "capability": self.capability, "gpu_name": self.gpu_name, "machine": self.machine,
                "isa": list(self.isa), "torch_threads": self.torch_threads}

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self), "isa": list(self.isa)}


def slug(model: str) -> str:
    """`Intel(R) Xeon(R) CPU @ 2.60GHz` -> `intel-xeon`: no marks, no clock, at most SLUG_CHARS."""
    text = re.sub(r"\((r|tm)\)|cpu|@.*$", "", model.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:SLUG_CHARS].strip("-") or "unknown"


def platform_id(device: str, cpu_model: str, gpu_name: str | None, capability: str, cores: int) -> str:
    """The id of a platform from its hardware; also used to migrate ids of older baseline files."""
    model = gpu_name if device != "cpu" and gpu_name else cpu_model
    return f"{device}-{slug(model)}-{capability}-{cores}c"


def _cpu_info() -> tuple[str, tuple[str, ...]]:
    from harness.machine import capability

    model, flags = capability.cpuinfo()
    isa = tuple(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags)
    return model or _platform.processor() or _platform.machine(), isa


@cache
def detect(device: str = "cpu") -> PlatformInfo:
    import torch
    import transformers

    from harness.machine import capability

    cpu_model, isa = _cpu_info()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return PlatformInfo(device=device, cpu_model=cpu_model, cpu_count=cores, torch_threads=torch.get_num_threads(),
                        gpu_name=gpu, python=_platform.python_version(), torch=torch.__version__,
                        transformers=transformers.__version__, machine=_platform.machine(), isa=isa,
                        capability=capability.detect().name)


def _library_versions(config: str) -> dict[str, str]:
    """oneDNN and MKL versions from torch.__config__.show() (the kernels behind bf16/fp32 linears)."""
    found = {}
    for name, pattern in (("onednn", r"MKL-DNN v([0-9][0-9.]*)"), ("mkl", r"Math Kernel Library Version ([0-9][0-9.]*)")):
        match = re.search(pattern, config)
        if match:
            found[name] = match.group(1).rstrip(".")
    return found


@cache
def software() -> dict[str, str]:
    """The versions that change kernels or decoding, recorded beside each baseline (not in the id)."""
    import torch
    import transformers

    versions = {"python": _platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    versions.update(_library_versions(torch.__config__.show()))
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    return versions


# Device nodes that a CUDA (NVIDIA) or ROCm (AMD, also torch.cuda) device has wherever it can be used.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")


def device_available(device: str) -> str | None:
    """None if the device can run here, else the reason (for skips and errors). A host without a GPU's
    device node is answered without importing torch (about 2 s: every collection of the perf tests)."""
    if device == "cpu":
        return None
    if device == "cuda" and not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return f"no CUDA device (no {' or '.join(GPU_DEVICE_NODES)} on this host)"
    import torch

    if device == "cuda":
        return None if torch.cuda.is_available() else "no CUDA device (torch.cuda.is_available() is False)"
    backend = getattr(torch, device, None)
    if backend is not None and hasattr(backend, "is_available") and backend.is_available():
        return None
    return f"no {device} device in this torch build"
