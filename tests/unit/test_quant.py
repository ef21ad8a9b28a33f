"""quant/: each method's layers against a float reference, int4 packing, AWQ against
round-to-nearest, per-token activation scales, save/load, and the errors for bad settings."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

import quant
from harness.workload import registry
from harness.workload.models import FLOAT_DTYPES
from quant import awq, layers
from quant.calibration import TokenWindows, corpus_text
from quant.layers import QuantSettingsError
from quant.walk import linear_layers
from memory_maps import in_mapping_of, mappings_of
from tiny_models import VOCAB, counted_prepacks, prompt, tiny_model, word_tokenizer

K, N = 256, 384


def outlier_inputs(rows: int = 64, seed: int = 0) -> torch.Tensor:
    """Activations like a transformer's: a few input channels 30x larger than the rest."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=g)
    x[:, :4] *= 30
    return x


def weight(seed: int = 1) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("make, bound", [
    (lambda w: layers.Int8DynamicLinear(w), 0.03),          # int8 x int8: about 1%
    (lambda w: layers.Int8WeightOnlyLinear(w), 0.02),       # int8 weights, bf16 activations
    (lambda w: layers.Int6WeightOnlyLinear(w), 0.04),       # 6 bits per group of 128: about 2%
    (lambda w: layers.Int4WeightOnlyLinear(w), 0.15),       # 4 bits per group of 128: about 8%
], ids=["int8-dynamic", "int8-weight-only", "int6-group128", "int4-group128"])
def test_each_layer_is_close_to_the_float_layer(make, bound):
    w, x = weight(), outlier_inputs()
    err = rel_err(make(w)(x), x @ w.t())
    assert err < bound
    assert err > 1e-4  # it really quantized


def test_int4_packing_round_trips_through_torchs_kernel():
    w = weight()
    layer = layers.Int4WeightOnlyLinear(w, group_size=64)
    q, scale, zero = layers.int4_groups(w, 64)
    # what the kernel computes against the identity is the dequantized weight, transposed
    expected = layers.int4_dequantize(q, scale.bfloat16().float(), zero.bfloat16().float(), 64)
    got = layer(torch.eye(K, dtype=torch.bfloat16)).float().t()
    assert torch.allclose(got, expected, atol=2e-3)
    assert q.min() >= 0 and q.max() <= 15


def test_int6_groups_hold_6_bit_values_per_group_and_the_int8_kernel_computes_them_exactly():
    w = weight() * torch.linspace(0.05, 1, K)  # groups of input channels with very different ranges
    layer = layers.Int6WeightOnlyLinear(w, group_size=64)
    groups = layer.weight_q.reshape(-1, 64).int()

    def multiplier(g: torch.Tensor) -> int | None:
        """The group's step as a multiple of the row's: every value is q * m with |q| <= 31."""
        fits = [m for m in (1, 2, 3, 4) if bool((g % m == 0).all()) and int(g.abs().max()) <= 31 * m]
        return fits[-1] if fits else None

    found = [multiplier(g) for g in groups]
    assert None not in found  # every group is 6-bit values (63 levels) times one multiplier
    assert {1, 4} <= set(found)  # and the groups really have their own steps
    expected = layers.int6_fake_quant(w, 64)
    got = layer(torch.eye(K, dtype=torch.bfloat16)).float().t()
    assert torch.allclose(got, expected, rtol=1e-2, atol=1e-5)
    # between int4's and int8's error on the same weights
    x = outlier_inputs()
    errs = [rel_err(make(x), x @ w.t()) for make in (layers.Int8WeightOnlyLinear(w), layer,
                                                      layers.Int4WeightOnlyLinear(w, group_size=64))]
    assert errs[0] < errs[1] < errs[2], errs


def test_awq_calibration_loss_beats_round_to_nearest_on_outlier_channels():
    w, x = weight(), outlier_inputs()
    scale, alpha, loss, rtn_loss = awq.search_scale(w, x, x.abs().mean(0), group_size=128, grid=20)
    assert alpha > 0
    assert loss < 0.8 * rtn_loss, (loss, rtn_loss)
    # and on held-out rows of the same distribution, through the real int4 kernel
    held = outlier_inputs(seed=5)
    ref = held @ w.t()
    awq_err = rel_err(layers.Int4WeightOnlyLinear(w, input_scale=scale)(held), ref)
    rtn_err = rel_err(layers.Int4WeightOnlyLinear(w)(held), ref)
    assert awq_err < rtn_err


def test_per_token_scales_make_a_verified_block_equal_to_one_token_at_a_time():
    w, x = weight(), outlier_inputs(rows=7)
    x[3] *= 50  # one token with a much larger range than the others
    per_token = layers.Int8DynamicLinear(w)
    rows = torch.cat([per_token(x[i:i + 1]) for i in range(7)])
    assert torch.equal(per_token(x), rows)
    # torch.ao's dynamic linear has one scale per call: the block and the rows differ
    lin = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False))
    with torch.no_grad():
        lin[0].weight.copy_(w)
    ao, _ = quant.quantize(lin, "w8af32-tensor")
    assert not torch.equal(ao(x), torch.cat([ao(x[i:i + 1]) for i in range(7)]))


@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated:DeprecationWarning")  # torch's own, the reference
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_the_dynamic_int8_draft_packs_each_weight_once_and_computes_as_torchs_own(monkeypatch, tmp_path):
    """w8af32-tensor builds torch's dynamic int8 layers without first packing an empty full-size
    weight (fbgemm's prepack is most of quantizing a draft), and they compute what torch's own do;
    with one scale per tensor too, saved and loaded."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    float_model = tiny_model("qwen2", seed=0, hidden=128)
    with torch.no_grad():  # the q/k/v biases, zero in a fresh model, must survive packing, saving and loading
        for layer in float_model.modules():
            if isinstance(layer, torch.nn.Linear) and layer.bias is not None:
                layer.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(layer.out_features))
    reference = quantize_dynamic(copy.deepcopy(float_model), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                 dtype=torch.qint8)
    packed = counted_prepacks(monkeypatch)
    model, record = quant.quantize(copy.deepcopy(float_model), "w8af32-tensor", progress=False)
    monkeypatch.undo()
    weights = [m.weight.numel() for m in float_model.modules() if isinstance(m, torch.nn.Linear)]
    assert record.layers == len(weights)
    assert sum(packed) <= sum(weights) + 2 * len(weights)  # each real weight once, beside 1x1 placeholders
    ours = {n: m for n, m in model.named_modules() if isinstance(m, DynamicLinear)}
    theirs = {n: m for n, m in reference.named_modules() if isinstance(m, DynamicLinear)}
    assert ours.keys() == theirs.keys() and len(ours) == len(weights)
    for name, layer in ours.items():
        (w, b), (w_ref, b_ref) = layer._packed_params._weight_bias(), theirs[name]._packed_params._weight_bias()
        assert torch.equal(w.int_repr(), w_ref.int_repr()) and torch.equal(w.q_per_channel_scales(), w_ref.q_per_channel_scales())
        assert (b is None) == (b_ref is None) and (b is None or torch.equal(b, b_ref))
        assert (layer.in_features, layer.out_features) == (theirs[name].in_features, theirs[name].out_features)
        assert repr(layer) == repr(theirs[name])
    assert torch.equal(model(prompt()).logits, reference(prompt()).logits)
    per_tensor, record = quant.quantize(copy.deepcopy(float_model), "w8af32-tensor", progress=False, per_channel=False)
    quant.save(per_tensor, record, tmp_path / "q.pt")
    loaded, _ = quant.load(copy.deepcopy(float_model), tmp_path / "q.pt")
    assert torch.equal(loaded(prompt()).logits, per_tensor(prompt()).logits)


def windows(rows: int = 4, length: int = 32) -> TokenWindows:
    ids = torch.randint(3, VOCAB, (rows, length), generator=torch.Generator().manual_seed(3))
    return TokenWindows("calibration", ids, hashlib.sha256(ids.numpy().tobytes()).hexdigest())


def greedy(model, n: int = 16) -> list[int]:
    out = model.generate(prompt(), max_new_tokens=n, do_sample=False)
    return out[0].tolist()


@pytest.mark.parametrize("method", ["w8af32", "w8af32-tensor", "w8abf16", "w8a8", "w4abf16", "w4abf16-rtn", "w6a16"])
def test_quantized_model_saves_loads_and_gives_the_same_tokens(method, tmp_path):
    dtype = getattr(torch, quant.base_dtype(method))
    float_model = tiny_model("qwen2", seed=0, hidden=128).to(dtype)
    settings = {"calibration": windows()} if quant.method(method).calibrated else {}
    model, record = quant.quantize(copy.deepcopy(float_model), method, progress=False, **settings)
    grouped = method.startswith("w4") or method == "w6a16"
    assert record.layers == 2 * 7 + (0 if grouped else 1)  # lm_head: int8, not int4 / int6
    if grouped:
        assert type(model.lm_head) is layers.Int8WeightOnlyLinear and record.settings["lm_head"] == "int8 weight-only"
    assert type(model.model.layers[0].mlp.down_proj).__name__.endswith("Linear")
    assert type(model.model.layers[0].mlp.down_proj) is not torch.nn.Linear
    tokens = greedy(model)
    quant.save(model, record, tmp_path / "q.pt")
    loaded, loaded_record = quant.load(copy.deepcopy(float_model), tmp_path / "q.pt")
    assert loaded_record.cached and loaded_record.settings == json.loads(json.dumps(record.settings))
    assert greedy(loaded) == tokens
    assert torch.equal(loaded(prompt()).logits, model(prompt()).logits)
    # the float reference decodes something close: the same first tokens at least
    assert greedy(float_model)[:prompt().shape[1] + 1] == tokens[:prompt().shape[1] + 1]


def test_a_loaded_checkpoint_maps_its_file_instead_of_copying_it(tmp_path):
    """A restored layer's int8 weight lies in the checkpoint file's own mapping (/proc/self/maps):
    loading copies no weight into the process's memory, and processes loading one checkpoint share it."""
    float_model = torch.nn.Sequential(torch.nn.Linear(256, 512))
    model, record = quant.quantize(copy.deepcopy(float_model), "w8af32", progress=False)
    path = tmp_path / "q.pt"
    quant.save(model, record, path)
    loaded, _ = quant.load(copy.deepcopy(float_model), path)
    weight = loaded[0].weight_q
    assert in_mapping_of(weight, path), f"weight at {weight.data_ptr():#x}, {path} mapped at {mappings_of(path)}"
    assert torch.equal(loaded(torch.ones(1, 256)), model(torch.ones(1, 256)))


def test_the_float_model_a_checkpoint_goes_into_is_built_on_its_files_pages(tmp_path):
    """transformers (5.23 with safetensors 0.8) builds a fetched float32 model on its safetensors
    file's mapped pages, not on copies: the Linear weights a checkpoint then replaces are never read
    into fresh memory (what is left of a start: docs/perf-gate.md, "A round"). A library that copies
    them again costs every gate arm the model's size in memory at its start."""
    from transformers import AutoModelForCausalLM

    from tiny_models import tiny_config

    folder = tmp_path / "model"
    AutoModelForCausalLM.from_config(tiny_config("qwen2"), dtype=torch.float32).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    weights = next(folder.glob("*.safetensors"))
    copied = [n for n, p in model.named_parameters() if not in_mapping_of(p, weights)]
    assert not copied, f"{len(copied)} parameters copied out of {weights} (first: {copied[0]})"


def test_a_checkpoint_the_filesystem_cannot_map_is_read_instead(tmp_path, monkeypatch, caplog):
    """Where mapping fails (mmap's ENODEV: a filesystem without it), the checkpoint is read into
    memory, with a warning, instead of being judged unreadable and quantized again on every run."""
    import errno

    float_model = torch.nn.Sequential(torch.nn.Linear(256, 512))
    model, record = quant.quantize(copy.deepcopy(float_model), "w8af32", progress=False)
    path = tmp_path / "q.pt"
    quant.save(model, record, path)
    real_load = torch.load

    def no_mapping(*args, mmap=None, **kwargs):
        if mmap:
            raise OSError(errno.ENODEV, "No such device")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", no_mapping)
    with caplog.at_level("WARNING", logger="quant"):
        loaded, loaded_record = quant.load(copy.deepcopy(float_model), path)
    assert loaded_record.cached and "read into memory, not mapped (OSError" in caplog.text
    assert torch.equal(loaded(torch.ones(1, 256)), model(torch.ones(1, 256)))


def test_a_truncated_checkpoint_is_a_clear_error(tmp_path):
    model, record = quant.quantize(tiny_model("llama", seed=0), "w8af32", progress=False)
    path = tmp_path / "q.pt"
    quant.save(model, record, path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(QuantSettingsError, match="not a readable quantized checkpoint .* delete it and quantize again"):
        quant.load(tiny_model("llama", seed=0), path)


def test_a_checkpoint_that_does_not_fit_leaves_the_model_untouched(tmp_path):
    """Checked whole first: a mismatch found late (a vector of another shape) must not leave the
    model half quantized, since the cache then quantizes it again from its float weights."""
    model, record = quant.quantize(tiny_model("llama", seed=0), "w8af32", progress=False)
    path = tmp_path / "q.pt"
    quant.save(model, record, path)
    saved = torch.load(path, weights_only=True)
    last = list(saved["vectors"])[-1]
    saved["vectors"][last] = torch.zeros(saved["vectors"][last].shape[0] + 1)
    torch.save(saved, path)
    fresh = tiny_model("llama", seed=0)
    before = {name: type(m) for name, m in fresh.named_modules()}
    with pytest.raises(QuantSettingsError, match=f"parameter {last!r} is not in this model or has another shape"):
        quant.load(fresh, path)
    assert {name: type(m) for name, m in fresh.named_modules()} == before


def test_a_killed_save_leaves_a_file_the_next_run_removes(tmp_path):
    from harness.core import locks

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{quant.PARTIAL_PREFIX}{dead.pid}-model-w8af32-0123.pt"
    live = tmp_path / f"{quant.PARTIAL_PREFIX}{os.getpid()}-model-w8af32-4567.pt"
    left.write_bytes(b"half a checkpoint")
    live.write_bytes(b"a save in progress")
    assert locks.sweep(tmp_path, quant.PARTIAL_PREFIX) == [left]
    assert live.exists() and not left.exists()
    model, record = quant.quantize(tiny_model("llama", seed=0), "w8af32", progress=False)
    quant.save(model, record, tmp_path / "q.pt")  # its own partial file is renamed into place
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["q.pt", live.name])


def test_pruning_removes_the_checkpoints_whose_model_folder_is_gone(tmp_path):
    """quant/cache.py `source_gone` opens each checkpoint as a load does: one whose source folder was
    deleted goes, one whose folder is there stays, and a damaged one is left to the load that will
    say what to do with it."""
    from harness.workload.models import prune_quantized

    model, record = quant.quantize(torch.nn.Sequential(torch.nn.Linear(64, 64)), "w8af32", progress=False)
    kept, gone = tmp_path / "kept-model", tmp_path / "gone-model"
    kept.mkdir()
    cache = tmp_path / "quantized"
    quant.save(model, record, cache / "kept.pt", source=str(kept))
    quant.save(model, record, cache / "orphan.pt", source=str(gone))
    (cache / "damaged.pt").write_bytes((cache / "kept.pt").read_bytes()[:100])
    assert prune_quantized(cache) == [cache / "orphan.pt"]
    assert sorted(p.name for p in cache.iterdir()) == ["damaged.pt", "kept.pt"]


@pytest.mark.parametrize("method, settings, message", [
    ("w4abf16-rtn", {"group_size": 100}, "group_size=100: torch's CPU int4 kernel takes 32, 64, 128, 256"),
    ("w4abf16-rtn", {"group_size": 128}, "layer 'model.layers.0.self_attn.q_proj': in_features 64 is not a multiple"),
    ("w4abf16", {}, "w4abf16 \\(AWQ\\) needs calibration text"),
    ("w8a8", {}, "w8a8 \\(SmoothQuant\\) needs calibration text"),
    ("w8abf16", {"group_size": 128}, "w8abf16 has no setting 'group_size'; its settings: skip"),
    ("w4abf16", {"grid": 0, "calibration": "x"}, "grid=0: give 1-100 alpha steps"),
    ("w4abf16", {"o_proj": "fold", "calibration": "x"}, "o_proj='fold': choose divide or rtn"),
    ("w4abf16-rtn", {"lm_head": "int4"}, "lm_head='int4': choose int8 or bf16"),
    ("w6a16", {}, "w6a16 \\(AWQ\\) needs calibration text"),
    ("w6a16", {"group_size": 100, "calibration": "x"}, "group_size=100: w6a16 takes 32, 64, 128, 256"),
    ("w6a16", {"calibration": "x"}, "layer 'model.layers.0.self_attn.q_proj': in_features 64 is not a multiple"),
    ("w4af16", {}, "unknown quantization method 'w4af16'. Did you mean 'w4abf16'\\?"),
])
def test_bad_settings_are_clear_errors_and_change_nothing(method, settings, message):
    model = tiny_model("llama", seed=0)  # hidden 64: no int4 group of 128 fits
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(QuantSettingsError, match=message):
        quant.quantize(model, method, progress=False, **settings)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(type(m) is not layers.Int4WeightOnlyLinear for m in model.modules())


def test_smoothquant_alpha_out_of_range():
    with pytest.raises(QuantSettingsError, match="alpha=1.5: SmoothQuant's migration strength is between 0 and 1"):
        quant.quantize(tiny_model("llama", seed=0), "w8a8", calibration=windows(), alpha=1.5, progress=False)


def test_registry_precisions_are_the_float_dtypes_and_the_quant_methods():
    assert set(registry.precisions()) == set(FLOAT_DTYPES) | set(quant.methods())


def test_calibration_and_heldout_text_share_no_file_and_ship_with_python():
    cal, held = corpus_text("calibration"), corpus_text("heldout")
    assert len(cal) > 100_000 and len(held) > 100_000
    assert cal[:2000] not in held


def test_every_precision_has_a_near_tie_epsilon():
    from harness.accuracy.equivalence import EPSILON

    assert set(EPSILON) == set(registry.precisions())


def test_the_cache_quantizes_once_per_model_method_and_settings(tmp_path):
    from quant.cache import cached_quantize

    model_dir = tmp_path / "model"
    tiny_model("qwen2", seed=0, hidden=128).save_pretrained(model_dir)
    cache = tmp_path / "cache"

    def fresh():
        return tiny_model("qwen2", seed=0, hidden=128).to(torch.bfloat16)

    first, rec1 = cached_quantize(fresh(), "w4abf16-rtn", model_dir, cache, progress=False)
    assert not rec1.cached and len(list(cache.iterdir())) == 1
    again, rec2 = cached_quantize(fresh(), "w4abf16-rtn", model_dir, cache, progress=False)
    assert rec2.cached and rec2.seconds == rec1.seconds  # the record says how long quantizing took
    assert greedy(again) == greedy(first)
    cached_quantize(fresh(), "w4abf16-rtn", model_dir, cache, progress=False, group_size=128)
    assert len(list(cache.iterdir())) == 1  # a default given explicitly is the same checkpoint
    cached_quantize(fresh(), "w4abf16-rtn", model_dir, cache, progress=False, group_size=64)
    assert len(list(cache.iterdir())) == 2  # other settings, another checkpoint
    # a damaged checkpoint is quantized again, not trusted
    for f in cache.iterdir():
        f.write_bytes(b"garbage")
    _, rec3 = cached_quantize(fresh(), "w4abf16-rtn", model_dir, cache, progress=False)
    assert not rec3.cached


def test_the_cache_drops_checkpoints_whose_model_is_gone_or_that_nobody_used_for_weeks(tmp_path, monkeypatch):
    import shutil

    from harness.workload import models
    from quant.cache import cached_quantize

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "quantized"
    dirs = {name: tmp_path / name for name in ("kept", "deleted", "idle")}
    for seed, folder in enumerate(dirs.values()):
        tiny_model("qwen2", seed=seed, hidden=128).save_pretrained(folder)
        cached_quantize(tiny_model("qwen2", seed=seed, hidden=128), "w8af32", folder, cache, progress=False)
    made = {name: next(cache.glob(f"{name}-*.pt")) for name in dirs}
    weeks_ago = made["kept"].stat().st_mtime - 20 * 86400
    for path in (made["kept"], made["idle"]):
        os.utime(path, (weeks_ago, weeks_ago))
    # a use refreshes the last use: the kept model is loaded from its checkpoint, the idle one is not
    _, record = cached_quantize(tiny_model("qwen2", seed=0, hidden=128), "w8af32", dirs["kept"], cache, progress=False)
    assert record.cached and made["kept"].stat().st_mtime > weeks_ago
    shutil.rmtree(dirs["deleted"])
    saving = cache / f"{quant.PARTIAL_PREFIX}{os.getpid()}-saving.pt"  # another process's save in progress
    saving.write_bytes(b"half")
    os.utime(saving, (weeks_ago, weeks_ago))

    # a load that quantizes (the cache grew) prunes; the checkpoint it made stays
    tiny_model("qwen2", seed=5, hidden=128).save_pretrained(tmp_path / "new")
    word_tokenizer().save_pretrained(tmp_path / "new")
    loaded = models.load(models.resolve_spec(registry.load_matrix(), str(tmp_path / "new")), "w8af32")
    assert not loaded.quant_record["cached"]
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == [".partial", "kept", "new"]


# ---------------------------------------------------------------------------------------------
# AWQ scales folded into the preceding norm / linear (issue 15)
# ---------------------------------------------------------------------------------------------
def outlier_qwen2(dtype=torch.float32):
    """A tiny Qwen2 (grouped-query attention, hidden 128) whose norms and up_proj give a few
    channels much larger inputs than the rest, so the AWQ search picks a non-trivial scale."""
    model = tiny_model("qwen2", seed=0, hidden=128)
    with torch.no_grad():
        for block in model.model.layers:
            block.input_layernorm.weight[:4] *= 20
            block.post_attention_layernorm.weight[-4:] *= 20
            block.mlp.up_proj.weight[:8] *= 20
    return model.to(dtype)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(prompt(length=24)).logits.float()


@pytest.mark.parametrize("skip", [("lm_head",), ("lm_head", "*.k_proj")], ids=["all", "k_proj-skipped"])
def test_awq_fold_leaves_the_float_model_computing_the_same(skip):
    model = outlier_qwen2()
    ref = logits(model)
    before = copy.deepcopy(model.state_dict())
    names = [n for n, _ in linear_layers(model, skip)]
    groups, why_not = awq.fold_groups(model, names)
    assert why_not is None
    scales, details = awq.search_and_fold(model, groups, windows(), group_size=128, grid=20, rows=64,
                                          progress=False)
    got = logits(model)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()
    # and the fold really moved scale: every norm it folded into and up_proj's rows changed
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    folded_into = {f"{g.prev}.weight" for g in groups if g.kind in ("norm", "rows")}
    assert folded_into and folded_into <= changed
    if skip == ("lm_head",):
        assert len(folded_into) == 3 * 2 and details["folded"] == 6 * 2 and details["divided"] == 2
        assert all((s is None) == (not n.endswith(".o_proj")) for n, s in scales.items())
    else:  # q and v keep their own scale (k stays float): the input norm is not touched
        assert details["divided"] == 3 * 2 and not any(".input_layernorm." in k for k in changed)
        assert all(k.endswith("_proj.weight") or ".post_attention_layernorm." in k for k in changed)


@pytest.mark.parametrize("o_proj", ["divide", "rtn"])
def test_awq_folded_layers_divide_nothing_at_run_time_only_o_proj_may(o_proj):
    model, record = quant.quantize(outlier_qwen2(torch.bfloat16), "w4abf16", calibration=windows(), o_proj=o_proj,
                                   progress=False)
    int4 = {n: m for n, m in model.named_modules() if type(m) is layers.Int4WeightOnlyLinear}
    assert len(int4) == 2 * 7
    assert all(m.input_scale is None for n, m in int4.items() if not n.endswith(".o_proj"))
    assert all((m.input_scale is not None) == (o_proj == "divide") for n, m in int4.items() if n.endswith(".o_proj"))
    assert record.settings["fold"] is True and record.settings["o_proj"] == o_proj
    assert (record.settings["folded"], record.settings["divided"] + record.settings["rtn"]) == (2 * 6, 2)
    assert record.settings["mean_alpha"] > 0


def test_awq_folded_checkpoint_round_trips_the_norms(tmp_path):
    model, record = quant.quantize(outlier_qwen2(torch.bfloat16), "w4abf16", calibration=windows(),
                                   progress=False)
    quant.save(model, record, tmp_path / "q.pt")
    fresh = outlier_qwen2(torch.bfloat16)
    norm = fresh.model.layers[0].input_layernorm.weight.clone()
    loaded, _ = quant.load(fresh, tmp_path / "q.pt")
    assert not torch.equal(loaded.model.layers[0].input_layernorm.weight, norm)  # the folded norm came back
    assert torch.equal(logits(loaded), logits(model))


def test_awq_on_an_architecture_it_cannot_fold_keeps_the_division_in_each_layer(caplog):
    model = tiny_model("opt", seed=0)  # LayerNorms with bias, fc1/fc2: not a fold it knows
    ref = copy.deepcopy(model)
    with caplog.at_level("INFO", logger="quant.awq"):
        q, record = quant.quantize(model.to(torch.bfloat16), "w4abf16", calibration=windows(), group_size=64,
                                   progress=False)
    assert "scales not folded (model_type 'opt' is not one of llama, qwen2)" in caplog.text
    int4 = [m for m in q.modules() if type(m) is layers.Int4WeightOnlyLinear]
    assert len(int4) == record.layers == record.settings["divided"] == 2 * 6 and record.settings["folded"] == 0
    assert all(m.input_scale is not None for m in int4)
    # the floats outside the int4 layers are untouched, and the output still follows the float model's
    assert all(torch.equal(p, ref.get_parameter(n).to(torch.bfloat16)) for n, p in q.named_parameters())
    assert greedy(q)[:prompt().shape[1] + 1] == greedy(ref)[:prompt().shape[1] + 1]


def test_awq_fold_off_is_todays_in_layer_division_and_another_checkpoint(tmp_path, monkeypatch):
    from quant.cache import key

    assert quant.settings_of("w4abf16")["fold"] is True
    model, record = quant.quantize(outlier_qwen2(torch.bfloat16), "w4abf16", calibration=windows(), fold=False,
                                   progress=False)
    assert record.settings["divided"] == 2 * 7 and record.settings["folded"] == 0
    assert all(m.input_scale is not None for m in model.modules() if type(m) is layers.Int4WeightOnlyLinear)
    model_dir = tmp_path / "model"
    tiny_model("qwen2", seed=0, hidden=128).save_pretrained(model_dir)
    folded = key(model_dir, "w4abf16", {})
    assert key(model_dir, "w4abf16", {"fold": False}) != folded
    # a checkpoint cached before the fold existed (no `fold` setting, format 2) is never the folded one's
    settings_of = quant.settings_of
    monkeypatch.setattr(quant, "settings_of", lambda name: {k: v for k, v in settings_of(name).items() if k != "fold"})
    monkeypatch.setattr(quant, "SAVE_FORMAT", 2)
    assert key(model_dir, "w4abf16", {}) != folded
