"""The CPU capability class and the registry's per-class choices, on any machine (faked ISA lists)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.childenv import python_path

from harness.workload.selection import Request, resolve
from harness.machine import capability, predict
from harness.workload import registry
from harness.core.errors import UnknownNameError
from harness.perf.combinations import combinations

AMX = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
ZEN4 = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16")
SKYLAKE = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl")
ZEN3 = ("avx2", "fma")


@pytest.mark.parametrize("flags, aten, env, expected", [
    (AMX, "AVX512", {}, "amx"),
    (ZEN4, "AVX512", {}, "avx512-bf16"),
    (SKYLAKE, "AVX512", {}, "avx512"),
    (ZEN3, "AVX2", {}, "avx2"),
    (("sse4_2",), "DEFAULT", {}, "generic"),
    # what torch will really use: the environment's limits win over the flags
    (AMX, "AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2"),
    (AMX, "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2"),
    (AMX, "AVX2", {}, "avx2"),
    (AMX, "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "avx512-bf16"),
    (AMX, "AVX512", {"DNNL_MAX_CPU_ISA": "avx512_core"}, "avx512"),
    (AMX, "AVX512", {"ONEDNN_MAX_CPU_ISA": "ALL"}, "amx"),
    # a limit can lower the class, never raise it above the CPU
    (ZEN3, "AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "avx2"),
])
def test_the_class_is_the_lowest_of_flags_aten_and_onednn(flags, aten, env, expected):
    cap = capability.classify(flags, aten, env)
    assert cap.name == expected
    assert cap.name in cap.why


def test_amx_needs_the_os_to_enable_its_tiles():
    assert capability.classify(AMX, "AVX512", {}, amx_enabled=False).name == "avx512-bf16"


def test_the_why_names_what_set_the_class():
    cap = capability.classify(AMX, "AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert "ATen's capability AVX2" in cap.why and "oneDNN limit AVX2" in cap.why


MATRIX = registry.DEFAULT_MATRIX
REPO = Path(__file__).resolve().parents[2]


def test_each_class_gets_its_own_choice_for_the_default_pair():
    pick = Request(pair="qwen-coder-1.5b+0.5b", check_here=False)
    sel = {c: resolve(registry.load_matrix(MATRIX, cpu_class=c), pick) for c in capability.CLASSES}
    assert (sel["amx"].target.precision, sel["amx"].draft.precision) == ("bf16", "w8af32-tensor")
    # bf16 verification of 7 tokens costs 6x one token with AVX2 kernels: the int8 target instead
    assert sel["avx2"].target.precision == "w8af32"
    assert sel["avx512"].target.precision == "w8af32"
    assert sel["avx512-bf16"].target.precision == "bf16" and sel["avx512-bf16"].k == 16
    for c in ("amx", "avx512-bf16", "avx512", "avx2"):
        assert sel[c].origin("target_precision") == f"cpu-class {c}" and f"CPU class {c} choice" in sel[c].reasons[0]
    assert sel["generic"].origin("target_precision") == "pair qwen-coder-1.5b+0.5b"
    assert "not measured on this class" in sel["generic"].reasons[0]


def test_chosen_perf_combinations_follow_the_class():
    ids = {c: {x.id for x in combinations(registry.load_matrix(MATRIX, cpu_class=c))} for c in ("amx", "avx2")}
    assert "qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k16:fused:c0.6" in ids["amx"]
    assert any(i.startswith("qwen-coder-1.5b+0.5b:w8af32+w8af32-tensor:cpu:greedy") for i in ids["avx2"])


def _with_class_table(tmp_path, table: str):
    text = MATRIX.read_text().replace('[pairs."smollm2-135m+lookup"]', table + '\n[pairs."smollm2-135m+lookup"]')
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return path


def test_an_unknown_class_in_the_registry_names_the_file_the_class_and_the_fix(tmp_path):
    path = _with_class_table(tmp_path, '[pairs."smollm2-135m+self".per_cpu_class.avx2-vnni]\n'
                                       'target_precision = "fp32"\nwhy = "x"\n')
    with pytest.raises(UnknownNameError) as info:
        registry.load_matrix(path, cpu_class="avx2")
    message = str(info.value)
    assert "avx2-vnni" in message and str(path) in message and "Did you mean 'avx2'" in message
    assert "\n" not in message


def test_a_choice_without_a_reason_is_refused(tmp_path):
    path = _with_class_table(tmp_path, '[pairs."smollm2-135m+self".per_cpu_class.avx2]\ntarget_precision = "fp32"\n')
    with pytest.raises(registry.RegistryError, match="why"):
        registry.load_matrix(path, cpu_class="avx2")


def test_the_leviathan_formula():
    # E for alpha 0.8, K 4: (1 - 0.8^5) / 0.2
    assert predict.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert predict.alpha_for(predict.expected_tokens(0.7, 6), 6) == pytest.approx(0.7, abs=1e-6)
    # the paper's improvement factor when verification costs one step (r = 1)
    alpha, k, c = 0.8, 4, 0.05
    paper = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    assert predict.speedup(predict.expected_tokens(alpha, k), k, c, 1.0) == pytest.approx(paper)
    # verification that costs 2 steps halves what it buys
    costs = predict.StepCosts(target_ms=100.0, verify_ms=200.0, draft_ms=10.0, k=4)
    assert costs.predict(4.0) == pytest.approx(4.0 / (4 * 0.1 + 2.0))


# --- detect() without importing torch: the cache of the class -------------------------------------

def _child_class(cache: Path, **env: str) -> tuple[str, bool]:
    """(class, whether torch was imported) as a fresh process with its cache in `cache` finds them."""
    code = ("import sys; from harness.machine import capability; "
            "print(capability.detect().name, 'torch' in sys.modules)")
    clean = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", *capability.ONEDNN_ENV)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**clean, "HARNESS_CACHE_DIR": str(cache), "PYTHONPATH": python_path(REPO), **env})
    assert r.returncode == 0, r.stderr
    name, imported = r.stdout.split()
    return name, imported == "True"


def test_the_class_is_found_once_and_read_after_without_torch(tmp_path):
    first = _child_class(tmp_path)
    again = _child_class(tmp_path)
    assert first[1] is True, "the first process has nothing to read: it asks torch"
    assert again == (first[0], False)
    entries = json.loads((tmp_path / "capability.json").read_text())
    assert [e["class"] for e in entries.values()] == [first[0]]


def test_the_variables_that_limit_the_kernels_are_part_of_the_cached_answer(tmp_path):
    """What ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA select is another answer, never the cached one."""
    native, _ = _child_class(tmp_path)
    limited = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert _child_class(tmp_path, **limited) == ("generic", True)
    assert _child_class(tmp_path, **limited) == ("generic", False)
    assert _child_class(tmp_path) == (native, False)


def test_a_cache_file_that_does_not_read_is_measured_again_and_replaced(tmp_path):
    (tmp_path / "capability.json").write_text('{"half a file')
    name, imported = _child_class(tmp_path)
    assert imported and name in capability.CLASSES
    assert _child_class(tmp_path) == (name, False)


X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx2
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd sve
CPU implementer\t: 0x41

processor\t: 1
Features\t: fp asimd
"""


@pytest.mark.parametrize("text, model, flags, generation", [
    (X86, "AMD EPYC", ("fpu", "avx2", "avx512f", "avx512_bf16"), "family 26 model 2"),  # the first processor's
    (ARM, None, ("fp", "asimd", "sve"), None),  # no model name, no family: said as unknown
    ("", None, (), None),                       # an unreadable /proc/cpuinfo
])
def test_the_cpu_is_read_from_the_first_processor(monkeypatch, text, model, flags, generation):
    monkeypatch.setattr(capability, "_cpuinfo_fields", lambda: capability.parse_cpuinfo(text))
    assert capability.cpuinfo() == (model, flags)
    assert capability.cpu_generation() == generation
