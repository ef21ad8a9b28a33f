"""A locally built copy of an installed package, optionally with a planted slowdown: the one
package in which two environments of an A/B gate across environments differ (--perf-base-env,
harness/perf/ab/environment.py), for its tests and for `benchmarks/ab_power.py --levels env:F`.

The wheel is written from the files the installed distribution lists (pure Python only), under a
local version label (`5.23.0+copy`, `5.23.0+planted0.10`) so that results name it. Nothing is
downloaded or compiled: it installs offline.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.core.errors import BadInputError

Edit = Callable[[str], str]
_SKIPPED_METADATA = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # written by the installer, not the wheel

# transformers' decoder layers (every model this suite runs wraps its layers' forward here):
# each layer's call is timed and followed by a spin of FRACTION of its own time
LAYERS_FILE = "transformers/modeling_layers.py"
LAYERS_ANCHOR = "            return forward(self, *args, **kwargs)\n\n        cls.forward = forward_with_checkpointing\n"
LAYERS_PLANTED = '''            _t0 = _planted_clock()
            _out = forward(self, *args, **kwargs)
            _planted_spin((_planted_clock() - _t0) * PLANTED_FRACTION)
            return _out

        cls.forward = forward_with_checkpointing
'''
LAYERS_HELPERS = '''

# planted by harness/perf/plant_package.py: every decoder layer {fraction:.0%} slower
from time import perf_counter as _planted_clock

PLANTED_FRACTION = {fraction!r}


def _planted_spin(seconds):
    end = _planted_clock() + seconds
    while _planted_clock() < end:
        pass
'''


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _entry(arcname: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
    return info


def write_wheel(out_dir: Path, name: str, version: str, files: Mapping[str, bytes]) -> Path:
    """A py3-none-any wheel of `files` (path inside the wheel -> bytes) in out_dir, its RECORD
    written, and its METADATA and WHEEL where `files` has none; written whole or not at all, and
    the same bytes for the same files (no timestamps: the environment cache keys on its hash)."""
    name = re.sub(r"[-_.]+", "_", name)
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: assisted-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             **files}
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-py3-none-any.whl"
    partial = wheel.with_name(wheel.name + ".partial")
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for arcname, data in files.items():
                z.writestr(_entry(arcname), data)
                writer.writerow((arcname, _record_hash(data), len(data)))
            writer.writerow((f"{info}/RECORD", "", ""))
            z.writestr(_entry(f"{info}/RECORD"), record.getvalue())
        partial.replace(wheel)
    finally:
        partial.unlink(missing_ok=True)
    return wheel


def wheel_of(distribution: str, out_dir: Path, *, local: str, edits: Mapping[str, Edit] | None = None) -> Path:
    """A wheel of the installed `distribution` at version `<its version>+<local>`, with `edits`
    (path inside the wheel -> text transform) applied. Its path in out_dir is returned."""
    if not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", local):
        raise BadInputError(f"local version label {local!r}: lower-case letters, digits and dots only (PEP 440)")
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise BadInputError(f"{distribution}: not installed in this environment; nothing to copy") from None
    edits = dict(edits or {})
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    version = f"{dist.version}+{local}"
    old_info, new_info = f"{name}-{dist.version}.dist-info", f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for entry in dist.files or []:
        path = str(entry)
        if path.startswith("..") or "__pycache__" in path or path.endswith(".pyc"):
            continue  # console scripts (bin/) and byte code: the installer makes its own
        info, _, rest = path.partition("/")
        if info.endswith(".dist-info") and rest in _SKIPPED_METADATA:
            continue
        if path.endswith((".so", ".pyd", ".dylib")):
            raise BadInputError(f"{distribution}: has compiled code ({path}); only a pure-Python package can be "
                                "copied into a py3-none-any wheel")
        data = Path(dist.locate_file(entry)).read_bytes()
        if path == f"{old_info}/METADATA":
            data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
        if path in edits:
            data = edits.pop(path)(data.decode()).encode()
        files[path.replace(old_info, new_info, 1) if info == old_info else path] = data
    if edits:
        raise BadInputError(f"{distribution} {dist.version}: no file {', '.join(edits)} to edit")
    return write_wheel(out_dir, name, version, files)


def plant_layers(fraction: float) -> Edit:
    """An edit of transformers/modeling_layers.py: every decoder layer `fraction` slower."""
    def edit(text: str) -> str:
        if LAYERS_ANCHOR not in text:
            raise BadInputError(f"{LAYERS_FILE}: this transformers' decoder-layer wrapper is not the one the plant "
                                "knows (harness/perf/plant_package.py LAYERS_ANCHOR); update the anchor")
        return text.replace(LAYERS_ANCHOR, LAYERS_PLANTED) + LAYERS_HELPERS.format(fraction=fraction)
    return edit


def transformers_wheel(out_dir: Path, fraction: float = 0.0) -> Path:
    """A copy of this environment's transformers: unchanged (`+copy`), or with every decoder layer
    `fraction` slower (`+planted<fraction>`)."""
    if fraction <= 0:
        return wheel_of("transformers", out_dir, local="copy")
    return wheel_of("transformers", out_dir, local=f"planted{fraction:.2f}",
                    edits={LAYERS_FILE: plant_layers(fraction)})
