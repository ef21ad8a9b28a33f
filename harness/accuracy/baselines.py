"""baselines/accuracy.json: HumanEval pass@1 per pair, precisions and task selection; read strictly,
validated against baselines/accuracy.schema.json, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from harness.core import jsonio
from harness.core.errors import IntegrityError
from harness.workload.registry import PACKAGE_DIR

PATH = PACKAGE_DIR.parent / "baselines" / "accuracy.json"
SCHEMA = PACKAGE_DIR.parent / "baselines" / "accuracy.schema.json"


class AccuracyBaselineError(IntegrityError):
    """baselines/accuracy.json (or an entry written to it) fails its strict read or its schema: fix or restore it."""


def key(pair: str, target_precision: str, draft_precision: str, selection: str) -> str:
    return f"{pair}:{target_precision}+{draft_precision}:{selection}"


def read(path: Path = PATH) -> dict[str, Any]:
    doc = jsonio.read_strict(path, AccuracyBaselineError)
    jsonio.validate(doc, SCHEMA, str(path), AccuracyBaselineError,
                    hint=f"fix or restore it (git checkout -- {path})")
    return doc


def entry(name: str, path: Path = PATH) -> dict[str, Any] | None:
    return read(path)["humaneval"].get(name)


def write_entry(name: str, value: dict[str, Any], path: Path = PATH) -> None:
    doc = read(path) if Path(path).is_file() else {"schema_version": 1, "humaneval": {}}
    doc["humaneval"][name] = value
    jsonio.validate(doc, SCHEMA, str(path), AccuracyBaselineError)
    jsonio.atomic_write_text(path, jsonio.dumps(doc, str(path), AccuracyBaselineError))
