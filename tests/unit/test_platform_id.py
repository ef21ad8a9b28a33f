"""The platform id is the hardware alone (harness/machine/platform.py): software versions are
recorded beside a baseline, never in its id; the capability class is in it, so a run restricted
to AVX2 kernels on an AMX machine is a platform of its own."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from harness.core.childenv import python_path
from harness.machine import platform

REPO = Path(__file__).resolve().parents[2]
MACHINE = platform.PlatformInfo(device="cpu", cpu_model="Intel(R) Xeon(R) Processor", cpu_count=2, torch_threads=2,
                                gpu_name=None, python="3.11.7", torch="2.13.0+cpu", transformers="5.23.0",
                                machine="x86_64", isa=("avx2", "avx512f", "amx_bf16"), capability="amx")


def test_the_id_is_readable_and_made_of_the_hardware():
    assert MACHINE.id == "cpu-intel-xeon-processor-amx-2c"
    assert platform.slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz") == "intel-xeon-platinum-8480"
    assert platform.slug("AMD EPYC 7763 64-Core Processor") == "amd-epyc-7763-64-core-processor"


def test_the_id_ignores_software_versions():
    upgraded = dataclasses.replace(MACHINE, python="3.12.4", torch="2.14.0+cpu", transformers="5.24.0",
                                   torch_threads=1)
    assert upgraded.id == MACHINE.id
    assert not {"python", "torch", "transformers"} & set(MACHINE.hardware())


def test_the_id_changes_with_the_hardware():
    ids = {MACHINE.id, dataclasses.replace(MACHINE, capability="avx2").id, dataclasses.replace(MACHINE, cpu_count=4).id,
           dataclasses.replace(MACHINE, cpu_model="AMD EPYC 7763 64-Core Processor").id,
           dataclasses.replace(MACHINE, device="cuda", gpu_name="NVIDIA H100 80GB HBM3").id}
    assert len(ids) == 5
    assert dataclasses.replace(MACHINE, capability="avx2").id == "cpu-intel-xeon-processor-avx2-2c"


def test_software_records_the_versions_that_change_kernels():
    versions = platform.software()
    assert {"python", "torch", "transformers"} <= set(versions)
    assert platform._library_versions("  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80af)\n  - Intel(R) oneAPI Math Kernel "
                                      "Library Version 2024.2-Product Build") == {"onednn": "3.12.0", "mkl": "2024.2"}


def test_the_avx2_restriction_is_another_platform():
    """The class follows ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY, read when torch starts: a child process."""
    code = "from harness.machine import platform; print(platform.detect('cpu').id)"
    env = {**os.environ, "PYTHONPATH": python_path(REPO), "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    restricted = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    here = platform.detect("cpu")
    assert restricted.stdout.strip() == dataclasses.replace(here, capability="avx2" if here.capability != "generic"
                                                            else "generic").id
