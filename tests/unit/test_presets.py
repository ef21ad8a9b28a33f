"""`--preset NAME` and `--reference-precision P` on tiny local models, the presets in the registry and
the perf matrix, and the int8 GEMM kernels behind w8af32 (oneDNN prepacked or torch._int_mm)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.workload.selection import Request
from harness.machine import capability, kernels
from harness.measure import bench
from harness.workload import models, registry
from harness.core.errors import HarnessError, RegistryError, UnknownNameError
from harness.perf.combinations import combinations
from quant.layers import INT8_KERNELS, Int8DynamicLinear, quantize_per_token
from test_cli import cli
from tiny_models import write_local_matrix


def _preset_tables(classes, *, target="w8af32", draft="fp32", k=3, reference="fp32") -> str:
    out = ""
    for cls in classes:
        out += (f'[pairs."tiny+draft".presets.fastest.{cls}]\ntarget_precision = "{target}"\n'
                f'draft_precision = "{draft}"\nnum_assistant_tokens = {k}\n'
                + (f'reference_precision = "{reference}"\n' if reference else "")
                + f'why = "planted for {cls}"\n\n')
    return out


def _with_presets(path, tables: str, perf_token: str | None = "fastest"):
    text = path.read_text().replace('[pairs."tiny+lookup"]', tables + '[pairs."tiny+lookup"]')
    if perf_token:
        text = text.replace('precisions = ["fp32+fp32"]', f'precisions = ["fp32+fp32", "{perf_token}"]')
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory):
    """The fastest preset measured on every class, so the tests run alike on any machine."""
    return _with_presets(write_local_matrix(tmp_path_factory.mktemp("tiny")), _preset_tables(capability.CLASSES))


def test_the_preset_of_this_class_sets_precisions_k_and_the_reference(tiny_matrix):
    m = registry.load_matrix(tiny_matrix)
    cfg = bench.build_config(m, Request(pair="tiny+draft", preset="fastest"))
    sel = cfg.selection
    assert (sel.target.precision, sel.draft.precision, sel.ks) == ("w8af32", "fp32", (3,))
    assert sel.reference_precision == "fp32" and sel.preset.cpu_class == m.cpu_class
    assert sel.origin("k") == sel.origin("target_precision") == "preset fastest"
    assert [c.label for c in cfg.configurations()] == ["plain", "plain fp32", "assisted k=3"]
    explicit = bench.build_config(m, Request(pair="tiny+draft", preset="fastest", target_precision="fp32", ks=(2,)))
    assert (explicit.selection.target.precision, explicit.selection.ks) == ("fp32", (2,))
    assert explicit.selection.origin("k") == "given" and explicit.selection.origin("draft_precision") == "preset fastest"
    assert explicit.reference is None  # the reference is the target's own precision: no second plain arm


def test_a_class_without_the_preset_and_an_unknown_preset_are_one_line_errors(tmp_path):
    path = _with_presets(write_local_matrix(tmp_path), _preset_tables(["amx"]), perf_token=None)
    m = registry.load_matrix(path, cpu_class="avx2")
    with pytest.raises(RegistryError) as info:
        bench.build_config(m, Request(pair="tiny+draft", preset="fastest"))
    message = str(info.value)
    assert message.startswith("--preset fastest:") and "CPU class avx2" in message and "measured on: amx" in message
    assert "\n" not in message
    with pytest.raises(UnknownNameError) as info:
        bench.build_config(m, Request(pair="tiny+draft", preset="fastst"))
    assert "Did you mean 'fastest'?" in str(info.value) and "--preset" in str(info.value)
    with pytest.raises(RegistryError, match="has no presets"):
        bench.build_config(m, Request(pair="tiny+lookup", preset="fastest"))


def test_a_preset_needs_a_why_and_a_draft_precision_and_a_known_class(tmp_path):
    base = write_local_matrix(tmp_path)
    original = base.read_text()
    for table, expected in (
            (_preset_tables(["amx"]).replace('why = "planted for amx"\n', ""), "why"),
            (_preset_tables(["amx"]).replace('draft_precision = "fp32"\n', ""), "give draft_precision"),
            (_preset_tables(["avx3"]), "Unknown CPU class 'avx3'")):
        base.write_text(original)
        _with_presets(base, table, perf_token=None)
        with pytest.raises(HarnessError, match=expected):
            registry.load_matrix(base)


def test_the_perf_matrix_runs_the_preset_of_this_class_and_skips_it_elsewhere(tmp_path):
    path = _with_presets(write_local_matrix(tmp_path), _preset_tables(["amx", "avx2"], k=5))
    ids = [c.id for c in combinations(registry.load_matrix(path, cpu_class="avx2"))]
    assert "tiny+draft:w8af32+fp32:cpu:greedy:k5" in ids
    ids = [c.id for c in combinations(registry.load_matrix(path, cpu_class="avx512"))]
    assert not any("w8af32" in i for i in ids) and "tiny+draft:fp32+fp32:cpu:greedy:k4" in ids


def test_bench_preset_runs_the_reference_arm_and_records_both_precisions(tiny_matrix, tmp_path):
    out = tmp_path / "r.json"
    r = cli("--matrix", str(tiny_matrix), "bench", "--preset", "fastest", "--no-progress", "--limit", "2",
            "--max-new-tokens", "8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "target tiny-target w8af32 (preset fastest), draft tiny-draft fp32 (preset fastest), K=3 (preset fastest)" in r.stdout
    assert "preset fastest for CPU class" in r.stdout
    assert "reference  plain decoding at fp32 runs beside plain w8af32" in r.stdout
    assert "Plain decoding, reference precision: target tiny-target (fp32)" in r.stdout
    assert "vs Reference" in r.stdout and "over the reference plain arm" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["target"]["precision"] == "w8af32" and doc["reference"]["precision"] == "fp32"
    assert doc["settings"]["reference_precision"] == "fp32" and doc["preset"]["name"] == "fastest"
    assert doc["selection"]["origins"]["reference_precision"] == "preset fastest"
    assert doc["selection"]["values"]["k"] == [3] and doc["selection"]["preset"] == "fastest"
    assisted = next(s for s in doc["summary"] if s["mode"] == "assisted")
    assert assisted["median_speedup_vs_reference"] > 0
    rows = [row for row in doc["rows"] if row["mode"] == "assisted"]
    assert rows and all(row["speedup_vs_reference"] > 0 for row in rows)
    # the reference arm really ran the other model: its plain tokens differ in speed, not in count
    configs = {s["configuration"] for s in doc["summary"]}
    assert configs == {"plain", "plain fp32", "assisted k=3"}
    # a version-1 file (before the reference arm) still reads, with null vs-reference speedups
    from harness.measure import report

    v1 = {**doc, "schema_version": 1, "rows": [{k: v for k, v in r.items() if k != "speedup_vs_reference"}
                                                for r in doc["rows"]],
          "summary": [{k: v for k, v in s.items() if k != "median_speedup_vs_reference"} for s in doc["summary"]]}
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(v1))
    read = report.read_json(old)
    assert read["schema_version"] == report.RESULTS_SCHEMA_VERSION and all(r["speedup_vs_reference"] is None for r in read["rows"])
    assert read["provenance"] is None  # measured before results recorded where they came from
    assert read["selection"] is None  # ... and before they recorded where each value came from


def test_without_a_reference_there_is_no_reference_column(tiny_matrix):
    r = cli("--matrix", str(tiny_matrix), "bench", "--no-progress", "--limit", "1", "--max-new-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "vs Reference" not in r.stdout and "reference plain arm" not in r.stdout


def test_a_reference_precision_whose_kernel_does_not_run_is_named_before_loading(tiny_matrix, monkeypatch):
    monkeypatch.setitem(kernels._WORKS, "w8abf16", "no int8 weight-only kernel in this torch")
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    m = registry.load_matrix(tiny_matrix)
    with pytest.raises(HarnessError) as info:
        bench.build_config(m, Request(pair="tiny+draft", reference_precision="w8abf16"))
    message = str(info.value)
    assert message.startswith("--reference-precision w8abf16:") and "no int8 weight-only kernel" in message
    assert "Precisions that run here: " in message and "\n" not in message


# ----------------------------------------------------------------------------------------------
# The int8 GEMM behind w8af32
# ----------------------------------------------------------------------------------------------
def _layer(seed: int = 0, n: int = 96, k: int = 256) -> Int8DynamicLinear:
    g = torch.Generator().manual_seed(seed)
    return Int8DynamicLinear(torch.randn(n, k, generator=g) * 0.05)


def test_each_int8_kernel_gives_a_row_alone_as_in_a_block_and_the_class_kernel_stays_near_exact():
    here = capability.detect()  # VNNI in the CPU and not cut off by a oneDNN limit (AVX512_CORE emulation)
    vnni = "avx512_vnni" in here.flags and (here.onednn_limit is None or "VNNI" in here.onednn_limit)
    layer = _layer(n=1024)  # wide enough for oneDNN (ONEDNN_MIN_OUT)
    x = torch.randn(1, 7, 256, generator=torch.Generator().manual_seed(0))
    x[..., 3] = 30.0  # an outlier channel, as real activations have
    out = {}
    for kernel in INT8_KERNELS:
        layer.use_kernel(kernel)
        assert layer.kernel == kernel
        block = layer(x)
        alone = torch.cat([layer(x[:, i:i + 1]) for i in range(7)], dim=1)
        assert torch.equal(block, alone), kernel  # a verified block computes each row as one token would
        out[kernel] = block
    # the floor of any int8 kernel: 8-bit per-token activations with the integer products summed exactly
    a_q, a_scale = quantize_per_token(x[0].float())
    ideal = ((a_q.double() @ layer.weight_q.double().t()) * a_scale.double() * layer.weight_scale.double()).float()
    exact = torch.nn.functional.linear(x, layer.weight_q.float() * layer.weight_scale[:, None])
    err = {k: ((v - exact).norm() / exact.norm()).item() for k, v in out.items()}
    floor = ((ideal[None] - exact).norm() / exact.norm()).item()
    if vnni:
        # VNNI or AMX sums u8 x s8 products in int32: oneDNN and torch._int_mm give the same exact products
        # (narrow layers fall back from one to the other), fbgemm's row-scaled 8 bits nearly as finely
        assert torch.equal(out["onednn"], out["int_mm"])
        assert not torch.equal(out["fbgemm"], out["int_mm"])
        assert err["fbgemm"] < 1.5 * err["int_mm"], err
    # without VNNI (AMD Zen 3) pairs of u8 x s8 products are added in int16, which saturates where the
    # outlier channel meets a large weight: oneDNN and fbgemm then err about twice the floor on this input
    # (on real activations it did not matter: quant/layers.py). The class's kernel stays within 2.5x everywhere.
    chosen = kernels.INT8_KERNEL[here.name]
    assert err[chosen] < 2.5 * floor, (chosen, err, floor)


def test_narrow_layers_stay_on_int_mm_under_onednn():
    from quant.layers import ONEDNN_MIN_OUT

    narrow, wide = _layer(n=ONEDNN_MIN_OUT // 4), _layer(n=ONEDNN_MIN_OUT)
    narrow.use_kernel("onednn")
    wide.use_kernel("onednn")
    assert (narrow.kernel, wide.kernel) == ("int_mm", "onednn")


def test_the_int8_kernel_follows_the_class_and_the_environment(monkeypatch):
    monkeypatch.delenv(kernels.INT8_KERNEL_ENV, raising=False)
    assert kernels.int8_kernel() == kernels.INT8_KERNEL[capability.detect().name]
    monkeypatch.setenv(kernels.INT8_KERNEL_ENV, "int_mm")
    assert kernels.int8_kernel() == "int_mm"
    monkeypatch.setenv(kernels.INT8_KERNEL_ENV, "amx")
    with pytest.raises(HarnessError, match="HARNESS_INT8_KERNEL='amx': choose one of onednn, int_mm"):
        kernels.int8_kernel()


def test_a_loaded_w8af32_model_runs_the_chosen_kernel_and_records_it(tiny_matrix, monkeypatch):
    for kernel in INT8_KERNELS:
        monkeypatch.setenv(kernels.INT8_KERNEL_ENV, kernel)
        m = registry.load_matrix(tiny_matrix)
        loaded = models.load(m.model("tiny-target"), "w8af32")
        layers = [x for x in loaded.model.modules() if isinstance(x, Int8DynamicLinear)]
        assert layers and all(x.kernel == kernel for x in layers if kernel != "onednn" or x.out_features >= 1024)
        assert loaded.quant_record["settings"]["int8_kernel"] == kernel


def test_the_reference_arm_runs_the_target_loaded_at_the_reference_precision(tiny_matrix, monkeypatch):
    ran: dict[str, set[bool]] = {}
    real = bench.measure_generation

    def spy(model, ids, settings, *, mode, k=None, assistant=None, tokenizer=None):
        quantized = any(isinstance(x, Int8DynamicLinear) for x in model.modules())
        ran.setdefault(f"{mode} {assistant is not None}", set()).add(quantized)
        return real(model, ids, settings, mode=mode, k=k, assistant=assistant, tokenizer=tokenizer)

    monkeypatch.setattr(bench, "measure_generation", spy)
    m = registry.load_matrix(tiny_matrix)
    cfg = bench.build_config(m, Request(pair="tiny+draft", preset="fastest", max_new_tokens=6), limit=1)
    bench.run_bench(cfg, progress=False)
    # plain runs happened on both models: the w8af32 target and the fp32 reference
    assert ran["plain False"] == {True, False} and ran["assisted True"] == {True}
