"""Strict JSON in, atomic JSON out, schema validation with errors that name the file and path.

Python's json accepts NaN, Infinity and 1e400 (which jsonschema's `exclusiveMinimum: 0` lets
through) and keeps the last of duplicate keys silently; here all are errors. Writes go to a temporary file in the same folder, are fsynced and renamed:
a reader sees the old file or the new one, never half of one, whatever interrupts the write.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from harness.core.errors import HarnessError


def _regular_or_absent(path: Path, error: type[Exception]) -> None:
    """A FIFO would hang a read, a folder fail a write half-way: both are named before anything is done."""
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a FIFO or device?)"
        raise error(f"{path}: {kind}; move it away or choose another path")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, then a rename)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all (a temporary file beside it, fsynced, then a rename)."""
    path = Path(path)
    _regular_or_absent(path, IsADirectoryError)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~_umask())  # as open() would make it: mkstemp's is 0600
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (Linux's /proc; else set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dumps(doc: Any, source: str, error: type[HarnessError]) -> str:
    try:
        return json.dumps(doc, indent=1, allow_nan=False) + "\n"
    except ValueError as exc:  # NaN/Infinity would not be valid JSON
        raise error(f"{source}: {exc}") from None


def loads_strict(text: str, source: str, error: type[HarnessError]) -> Any:
    def reject_constant(name: str) -> Any:
        raise error(f"{source}: {name} is not valid JSON (numbers must be finite)")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise error(f"{source}: duplicate key {key!r}")
            seen.add(key)
        return dict(pairs)

    if not text.strip():
        raise error(f"{source}: the file is empty")
    try:
        doc = json.loads(text, parse_constant=reject_constant, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not valid JSON (truncated or edited?): {exc}") from None
    return _reject_overflow(doc, source, error)


def _reject_overflow(doc: Any, source: str, error: type[HarnessError], path: str = "") -> Any:
    """1e400 parses to inf without passing through parse_constant."""
    if isinstance(doc, float) and (doc != doc or doc in (float("inf"), float("-inf"))):
        raise error(f"{source}: {path or '(top level)'}: number out of range (not finite)")
    if isinstance(doc, dict):
        for k, v in doc.items():
            _reject_overflow(v, source, error, f"{path}/{k}" if path else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            _reject_overflow(v, source, error, f"{path}/{i}" if path else str(i))
    return doc


def read_strict(path: Path, error: type[HarnessError]) -> Any:
    _regular_or_absent(Path(path), error)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: {exc}") from None
    return loads_strict(text, str(path), error)


@cache
def schema(path: Path) -> dict[str, Any]:
    """A JSON schema file of the project, read once."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


@cache
def _validator(path: Path) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(path))


def validate(doc: Any, schema_path: Path, source: str | Callable[[list[Any]], Any], error: type[HarnessError],
             hint: str = "", sep: str = "/") -> None:
    """Check `doc` against the schema file; the first problem (by path) becomes one `error` line that
    names `source` (or what `source(keys)` names: a document merged from several files) and where in
    the document, joined with `sep` ('.' for TOML keys)."""
    errors = sorted(_validator(Path(schema_path)).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        keys = list(errors[0].absolute_path)
        where = sep.join(str(p) for p in keys) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        named = source(keys) if callable(source) else source
        raise error(f"{named}: {where}: {errors[0].message}{more}" + (f". {hint}" if hint else ""))
