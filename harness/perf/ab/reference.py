"""The reference commit: the commit whose performance was last accepted (baselines/reference.json).

`pytest -m perf --perf-against reference` gates the working tree against it, and so does a perf run
on a platform without stored baselines. `python -m harness reference move` moves it, after an A/B
run that shows what the move accepts; the file keeps why it moved and that run's verdicts.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.core import jsonio
from harness.core.errors import IntegrityError
from harness.workload.registry import PACKAGE_DIR

PATH = PACKAGE_DIR.parent / "baselines" / "reference.json"
SCHEMA = PACKAGE_DIR.parent / "baselines" / "reference.schema.json"
SCHEMA_VERSION = 1
NAME = "reference"  # --perf-against reference


class ReferenceCommitError(IntegrityError):
    """baselines/reference.json is missing or malformed."""


@dataclass
class Reference:
    commit: str
    moved: str                    # ISO date-time of the move
    reason: str
    previous: str | None = None
    evidence: list[str] = field(default_factory=list)  # the A/B run's summary lines

    def as_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}


def read(path: Path = PATH) -> Reference:
    if not Path(path).exists():
        raise ReferenceCommitError(f"{path} does not exist; name the reference commit with "
                             "`python -m harness reference move --reason TEXT`")
    doc = jsonio.read_strict(path, ReferenceCommitError)
    jsonio.validate(doc, SCHEMA, str(path), ReferenceCommitError, hint="restore it from git")
    doc.pop("schema_version")
    return Reference(**doc)


def write(reference: Reference, path: Path = PATH) -> None:
    """Validated first, then written atomically."""
    doc = reference.as_dict()
    jsonio.validate(doc, SCHEMA, f"new reference for {path}", ReferenceCommitError)
    jsonio.atomic_write_text(path, jsonio.dumps(doc, str(path), ReferenceCommitError))


def moved_to(commit: str, reason: str, previous: Reference | None, evidence: list[str]) -> Reference:
    return Reference(commit=commit, moved=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     reason=reason, previous=previous.commit if previous else None, evidence=evidence)
