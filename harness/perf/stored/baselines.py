"""Per-platform baselines: read, validate, migrate, merge and write `baselines/<platform-id>.json`.

A baseline file belongs to one platform: the hardware (harness/machine/platform.py: device, CPU
model, capability class, cores). The software it was measured with is recorded beside it (the
file's `software`, and each combination's `versions`), and so is the host-speed probe of the host
that measured it (each combination's `host_probe`, harness/machine/hostspeed.py). It is validated
against baselines/schema.json on read and on write, written atomically (temporary file, fsync,
rename), and only this machine's file is ever written. Older schema versions are migrated by an
explicit function per version step (`MIGRATIONS`); a version without one is an error, never a guess.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import jsonio, locks
from harness.machine import capability, hostspeed, platform
from harness.core.errors import IntegrityError
from harness.workload.models import lock_file
from harness.workload.registry import PACKAGE_DIR

SCHEMA_VERSION = 3
SCHEMA_PATH = PACKAGE_DIR.parent / "baselines" / "schema.json"
DEFAULT_DIR = PACKAGE_DIR.parent / "baselines"
UPDATE_COMMAND = "pytest -m perf --perf-update-baselines"

V1_BLOCK = 8  # the perf batch (rounds per block) that every version-1 file was measured with


def _v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 2 adds the between-run spread per metric (drift_sd, drift_df, block). Version-1
    files stored their rounds in order, so it is computed from them, as a new file would be."""
    from harness.perf.stored import stats

    for record in doc.get("combinations", {}).values():
        for key, entry in record.items():
            if isinstance(entry, dict) and isinstance(entry.get("samples"), list):
                drift, df = stats.drift_sd(entry["samples"], V1_BLOCK)
                entry.update(drift_sd=round(drift, 6), drift_df=df, block=V1_BLOCK)
    return doc


V2_SOFTWARE = ("python", "torch", "transformers")  # what version-2 files kept in `platform`
# version-2 files kept these CPU flags (`platform.isa`); the best class each allows, best first
V2_ISA_CLASS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2"))


def _v2_to_v3(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 3 keys a file by the hardware alone. The versions that version 2 kept in `platform`
    (and hashed into the id) move to `software`, and into each combination's `versions` where it
    lacks them (every combination of a version-2 file was measured with them: another version was
    another file). The capability class is the best the recorded flags allow (version 2 did not
    record a kernel restriction). The id is made again from the hardware, so the file must be
    renamed to it: loading the old name says so."""
    plat = doc.get("platform")
    if not isinstance(plat, dict):
        return doc  # validation names what is wrong
    software = {key: plat.pop(key) for key in V2_SOFTWARE if key in plat}
    isa = plat.get("isa") if isinstance(plat.get("isa"), list) else []
    plat.setdefault("capability", next((cls for flag, cls in V2_ISA_CLASS if flag in isa), "generic"))
    plat["id"] = platform.platform_id(str(plat.get("device")), str(plat.get("cpu_model")), plat.get("gpu_name"),
                                      plat["capability"], plat.get("cpu_count", 0))
    for record in (doc.get("combinations") or {}).values():
        if isinstance(record, dict) and isinstance(record.get("versions"), dict):
            for key, value in software.items():
                record["versions"].setdefault(key, value)
    return {"schema_version": doc.get("schema_version"), "platform": plat, "software": software,
            **{k: v for k, v in doc.items() if k not in ("schema_version", "platform")}}


# version N -> function turning a version-N document into a version-(N+1) document
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}


class BaselineError(IntegrityError):
    """A baseline file that cannot be used; the message names the file, the JSON path and the fix."""


def _hint(path: Path) -> str:
    return (f"Fix or restore the file (git checkout -- {path}), or measure this machine again with "
            f"`{UPDATE_COMMAND}` and review the diff")


def path_for(directory: Path, platform_id: str) -> Path:
    return Path(directory) / f"{platform_id}.json"


def migrate(doc: dict[str, Any], source: str) -> dict[str, Any]:
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f"{source}: schema_version: expected an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise BaselineError(f"{source}: schema_version {version} is newer than this harness reads "
                            f"({SCHEMA_VERSION}); update the harness (git pull) rather than the file")
    doc = copy.deepcopy(doc)
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise BaselineError(f"{source}: schema_version {version} has no migration to {version + 1}; "
                                f"regenerate the file with `{UPDATE_COMMAND}`")
        doc = step(doc)
        version += 1
        doc["schema_version"] = version
    return doc


def validate(doc: Any, source: str, path: Path) -> None:
    jsonio.validate(doc, SCHEMA_PATH, source, BaselineError, hint=_hint(path))


def load(path: Path, *, platform_id: str | None = None, cpu_class: str | None = None) -> dict[str, Any] | None:
    """The validated (and, if old, migrated) document, or None when the file does not exist.
    With `platform_id` it must be that platform's file; with `cpu_class` its numbers must have been
    measured with that capability class's kernels."""
    path = Path(path)
    if not path.exists():
        return None
    doc = jsonio.read_strict(path, BaselineError)
    if not isinstance(doc, dict):
        raise BaselineError(f"{path}: (top level): expected a JSON object. {_hint(path)}")
    doc = migrate(doc, str(path))
    validate(doc, str(path), path)
    owner = doc["platform"]["id"]
    if owner != path.stem:
        raise BaselineError(f"{path}: platform/id: the file holds platform {owner!r} but is named "
                            f"{path.name!r}; rename it (git mv {path} {path.with_name(owner + '.json')}) or restore it")
    if platform_id is not None and owner != platform_id:
        raise BaselineError(f"{path}: platform/id: {owner!r} is another machine's baseline; this machine is "
                            f"{platform_id!r} (its file: {path.with_name(platform_id + '.json').name})")
    theirs = doc["platform"]["capability"]
    if cpu_class is not None and theirs != cpu_class:
        raise BaselineError(
            f"{path}: platform/capability: measured with the {theirs!r} class's kernels, but this run uses the "
            f"{cpu_class!r} class, so its numbers are of other kernels and are not compared. Restore the file "
            f"(git checkout -- {path}) if it was edited, or measure this class into its own file with "
            f"`{UPDATE_COMMAND}` (python -m harness doctor shows the class and why)")
    return doc


def merged(old: dict[str, Any] | None, hardware: Mapping[str, Any], software: Mapping[str, str],
           records: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """This machine's document with the measured combinations replaced or added; others kept.
    `software` becomes the file's: the versions of this update (each record keeps its own)."""
    combos = {**copy.deepcopy((old or {}).get("combinations", {})), **copy.deepcopy(dict(records))}
    return {"schema_version": SCHEMA_VERSION, "platform": dict(hardware), "software": dict(software),
            "combinations": dict(sorted(combos.items()))}


def lock_for(path: Path) -> Path:
    """The lock that an update holds while it re-reads, merges and writes `path` (kept in the cache,
    not beside the baselines: nothing stray in the repository)."""
    return lock_file(f"baselines-{locks.path_key(path)}")


def write(path: Path, doc: dict[str, Any]) -> None:
    """Validate first, then replace atomically: an error or Ctrl-C leaves the old file as it was."""
    path = Path(path)
    validate(doc, f"new baselines for {path}", path)
    if doc["platform"]["id"] != path.stem:
        raise BaselineError(f"{path}: refusing to write platform {doc['platform']['id']!r} into another "
                            "platform's file")
    jsonio.atomic_write_text(path, jsonio.dumps(doc, str(path), BaselineError))


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Human-readable lines: which combinations were added or changed, medians before -> after."""
    before = (old or {}).get("combinations", {})
    lines = []
    for cid, rec in new["combinations"].items():
        prev = before.get(cid)
        if prev is None:
            lines.append(f"+ {cid}: plain {rec['plain_tokens_per_sec']['median']:.3g} tok/s, assisted "
                         f"{rec['assisted_tokens_per_sec']['median']:.3g} tok/s, speedup {rec['speedup']['median']:.3g}x")
            continue
        if prev == rec:
            continue
        parts = []
        for key, unit in (("plain_tokens_per_sec", " tok/s"), ("assisted_tokens_per_sec", " tok/s"), ("speedup", "x")):
            a, b = prev[key]["median"], rec[key]["median"]
            parts.append(f"{key} {a:.3g}{unit} -> {b:.3g}{unit} ({(b / a - 1) * 100:+.1f}%)")
        if prev.get("exact") != rec.get("exact"):
            parts.append("exact counters changed")
        lines.append(f"~ {cid}: " + ", ".join(parts))
    return lines


SOFTWARE_ORDER = ("python", "torch", "transformers", "onednn", "mkl", "cuda", "harness")


def software_changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """`torch 2.13.0 -> 2.14.0` for each version recorded on both sides that differs (a version
    recorded on one side only, e.g. oneDNN in a file older than its record, says nothing)."""
    keys = [k for k in SOFTWARE_ORDER if k in recorded] + sorted(set(recorded) - set(SOFTWARE_ORDER))
    return [f"{k} {recorded[k]} -> {current[k]}" for k in keys if k in current and recorded[k] != current[k]]


def newest_probe(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The host-speed probe of the file's most recently measured combination that has one."""
    records = [r for r in doc.get("combinations", {}).values() if r.get("host_probe")]
    return max(records, key=lambda r: r["date"])["host_probe"] if records else None


@dataclass
class Nearest:
    """The known platform closest to a new one, and why it was picked."""

    path: Path
    doc: dict[str, Any]
    why: str
    skipped: list[str] = field(default_factory=list)  # files that could not be read, with the reason


def _class_rank(name: str) -> int:
    return capability.rank(name) if name in capability.CLASSES else len(capability.CLASSES)


def _distance(theirs: Mapping[str, Any], ours: Mapping[str, Any], common: int) -> tuple:
    """Smaller is nearer: same device, then same capability class, then same CPU model, then the
    most similar (some combinations in common, the nearest class, the nearest core count, most in common)."""
    return (theirs["device"] != ours["device"], theirs["capability"] != ours["capability"],
            theirs["cpu_model"] != ours["cpu_model"], common == 0,
            abs(_class_rank(theirs["capability"]) - _class_rank(ours["capability"])),
            abs(math.log(theirs["cpu_count"] / ours["cpu_count"])), -common, theirs["id"])


def _why(theirs: Mapping[str, Any], ours: Mapping[str, Any], common: int, total: int) -> str:
    def same(key: str, label: str) -> str:
        return (f"same {label} ({ours[key]})" if theirs[key] == ours[key]
                else f"other {label} ({theirs[key]} there, {ours[key]} here)")
    return ", ".join([same("device", "device"), same("capability", "capability class"), same("cpu_model", "CPU model"),
                      same("cpu_count", "core count"), f"{common} of {total} combinations in common"])


def candidates(directory: Path, exclude: Path) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """Every readable baseline file in `directory` but `exclude`; and a line per unreadable one.
    Files that are not baselines (schema.json, reference.json, accuracy.json) are passed over."""
    found, skipped = [], []
    for path in sorted(Path(directory).glob("*.json")):
        if path == Path(exclude) or path.name.endswith("schema.json"):
            continue
        try:
            raw = jsonio.read_strict(path, BaselineError)
            if not (isinstance(raw, dict) and "platform" in raw and "combinations" in raw):
                continue
            found.append((path, load(path)))
        except BaselineError as exc:
            skipped.append(f"{path.name}: {exc}")
    return found, skipped


def nearest(directory: Path, new: Mapping[str, Any], path: Path) -> Nearest | None:
    """The known platform nearest to `new` (a document about to be written to `path`), or None."""
    ours, ids = new["platform"], set(new["combinations"])
    found, skipped = candidates(directory, path)
    if not found:
        return None
    scored = [(_distance(doc["platform"], ours, len(ids & set(doc["combinations"]))), p, doc) for p, doc in found]
    _, best_path, best = min(scored, key=lambda item: item[0])
    why = _why(best["platform"], ours, len(ids & set(best["combinations"])), len(ids))
    return Nearest(best_path, best, why, skipped)


def nearest_lines(directory: Path, new: Mapping[str, Any], path: Path, current_probe: Mapping[str, Any] | None) -> list[str]:
    """What `--perf-update-baselines` prints for a platform without a file yet: the nearest known
    platform, why, the software and host-speed differences, and the new measurements against it."""
    near = nearest(directory, new, path)
    if near is None:
        return [f"{path.name} is a new platform; no other baseline in {directory} to compare with"]
    lines = [f"{path.name} is a new platform; nearest known platform: {near.path.name} ({near.why})"]
    changed = software_changes(near.doc["software"], new["software"])
    lines.append("  software: " + (", ".join(changed) if changed else "the same versions"))
    stored = newest_probe(near.doc)
    host = hostspeed.compare(stored, current_probe) if stored and current_probe else None
    if host is not None:
        lines.append(f"  host probe: this host is {host.headline()} than the one that measured {near.path.name} "
                     f"({host.describe(stored, current_probe)})")
    lines.append(f"  new measurements against {near.path.name}:")
    lines += ["    " + c for c in changes(near.doc, dict(new))] or ["    (no change)"]
    lines += [f"  (not compared: {s})" for s in near.skipped]
    return lines
