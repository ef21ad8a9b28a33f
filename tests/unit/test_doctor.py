"""`python -m harness doctor` and bench's CPU-class lines on tiny local models, natively and with the
kernels restricted to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2), on any x86 machine."""

from __future__ import annotations

import json

import pytest

from harness.machine import kernels
from harness.workload import models, registry, selection
from harness.core.errors import HarnessError
from test_cli import cli
from tiny_models import write_local_matrix

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
AVX2_CHOICE = '''
[pairs."tiny+draft".per_cpu_class.avx2]
target_precision = "w8af32"
num_assistant_tokens = 3
why = "planted by the test"
'''


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory):
    path = write_local_matrix(tmp_path_factory.mktemp("tiny"))
    path.write_text(path.read_text().replace('[pairs."tiny+lookup"]', AVX2_CHOICE + '[pairs."tiny+lookup"]'))
    return path


def test_doctor_names_the_class_times_the_kernels_and_predicts_the_speedup(tiny_matrix, tmp_path):
    out = tmp_path / "doctor.json"
    r = cli("--matrix", str(tiny_matrix), "doctor", "--precisions", "fp32,bf16,w8af32", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "CPU class" in r.stdout and "no avx2" not in r.stdout
    for precision in ("fp32", "bf16", "w8af32"):
        assert f"  {precision} " in r.stdout
    # the pair's K for this host's class: 4, or 3 on an AVX2 host (the choice planted above)
    k = selection.resolve(registry.load_matrix(tiny_matrix), selection.Request(pair="tiny+draft")).k
    assert f"predicted speedup at K={k}" in r.stdout and "E / (K c + r)" in r.stdout
    doc = json.loads(out.read_text())
    prediction = doc["prediction"]
    assert prediction["costs"]["k"] == k and prediction["predicted_speedup"] > 0
    assert set(prediction["verify_ms"]) == {str(m) for m in range(1, 10)}
    assert [row["precision"] for row in doc["target_layer"]] == ["fp32", "bf16", "w8af32"]
    assert all(set(row["ms"]) == {str(m) for m in range(1, 9)} for row in doc["target_layer"])


def test_under_the_avx2_restriction_the_avx2_choice_is_used_and_said(tiny_matrix, tmp_path):
    r = cli("--matrix", str(tiny_matrix), "doctor", "--precisions", "fp32", "--no-models", env=AVX2)
    assert r.returncode == 0, r.stderr
    assert "CPU class  avx2:" in r.stdout and "ATen kernels AVX2, oneDNN limit AVX2" in r.stdout
    assert "target w8af32 (cpu-class avx2), draft fp32 (pair tiny+draft), K=3 (cpu-class avx2)" in r.stdout
    assert "planted by the test" in r.stdout

    out = tmp_path / "bench.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "--limit", "1", "--json", str(out), env=AVX2)
    assert r.returncode == 0, r.stderr
    assert "CPU class avx2:" in r.stdout and "target tiny-target w8af32 (cpu-class avx2)" in r.stdout
    assert "CPU class avx2 choice (tiny+draft.per_cpu_class.avx2)" in r.stdout
    assert "assisted k=3: median" in r.stdout and "predicted" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["cpu_class"]["class"] == "avx2" and doc["target"]["precision"] == "w8af32"
    assert doc["prediction"]["3"]["predicted_speedup"] > 0


def test_an_explicit_precision_wins_over_the_class_choice_and_says_so(tiny_matrix):
    r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "--limit", "1", "--max-new-tokens", "8",
            "--target-precision", "fp32", env=AVX2)
    assert r.returncode == 0, r.stderr
    assert "target tiny-target fp32 (given), draft tiny-draft fp32 (pair tiny+draft), K=3 (cpu-class avx2)" in r.stdout


def test_a_precision_whose_kernel_does_not_run_here_fails_before_loading(tiny_matrix, monkeypatch):
    monkeypatch.setitem(kernels._WORKS, "w8af32", "fbgemm is not built into this torch")
    m = registry.load_matrix(tiny_matrix)
    with pytest.raises(HarnessError) as info:
        models.load(m.model("tiny-target"), "w8af32")
    message = str(info.value)
    assert "'w8af32'" in message and kernels.kernel_name("w8af32") in message and "fbgemm is not built" in message
    assert "class " in message and "Precisions that run here: " in message and "fp32" in message
    assert "\n" not in message
