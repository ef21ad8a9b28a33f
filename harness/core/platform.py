"""Detect the machine: device, CPU/GPU model, cores, library versions -> a platform id.

The id keys the per-platform baselines: `<device>-<cpu or gpu model>-<N>c-<hash>`, where the hash
covers the whole fingerprint (library versions included), so a driver or library change is a new
platform rather than a silent comparison against another machine's numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
import re
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any


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

    def fingerprint(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("torch_threads")  # a run setting, not the machine
        return d

    @property
    def id(self) -> str:
        model = self.gpu_name if self.device != "cpu" and self.gpu_name else self.cpu_model
        slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)|cpu|@.*$", "", model.lower())).strip("-")[:40]
        digest = hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.device}-{slug or 'unknown'}-{self.cpu_count}c-{digest}"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self), "isa": list(self.isa)}


def _cpu_info() -> tuple[str, tuple[str, ...]]:
    model, flags = _platform.processor() or _platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", _platform.machine(), _platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = tuple(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags)
    return model, isa


@cache
def detect(device: str = "cpu") -> PlatformInfo:
    import torch
    import transformers

    cpu_model, isa = _cpu_info()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return PlatformInfo(device=device, cpu_model=cpu_model, cpu_count=cores, torch_threads=torch.get_num_threads(),
                        gpu_name=gpu, python=_platform.python_version(), torch=torch.__version__,
                        transformers=transformers.__version__, machine=_platform.machine(), isa=isa)


def device_available(device: str) -> str | None:
    """None if the device can run here, else the reason (for skips and errors)."""
    import torch

    if device == "cpu":
        return None
    if device == "cuda":
        return None if torch.cuda.is_available() else "no CUDA device (torch.cuda.is_available() is False)"
    backend = getattr(torch, device, None)
    if backend is not None and hasattr(backend, "is_available") and backend.is_available():
        return None
    return f"no {device} device in this torch build"
