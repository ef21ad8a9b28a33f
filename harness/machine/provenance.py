"""Where a results file came from: the commit of the code that measured and whether its tree had
uncommitted changes, the date, the platform id, the CPU class, this host's speed probe and the
software versions. bench's JSON and the perf gate's results.json each carry one (`provenance`),
so that any measurement can be placed on a commit and a machine later (a history of runs)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The repository the harness runs from: harness/machine/provenance.py -> its root.
SOURCE_TREE = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Provenance:
    commit: str | None             # full sha of HEAD; None where the code is not in a git checkout
    dirty: bool | None             # tracked files differ from HEAD (None with no commit)
    date: str                      # when it was measured, ISO 8601 in UTC
    platform_id: str               # harness/machine/platform.py: names the baseline file too
    cpu_class: str                 # harness/machine/capability.py
    host_probe: dict[str, Any] | None  # harness/machine/hostspeed.py measure(); None where none was taken
    software: dict[str, str]       # python, torch, transformers, oneDNN, MKL, CUDA, harness

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def software_versions() -> dict[str, str]:
    """The versions a measurement depends on: harness/machine/platform.py software() and the harness."""
    from harness import __version__
    from harness.machine import platform

    return {**platform.software(), "harness": __version__}


def git_state(tree: Path = SOURCE_TREE) -> tuple[str | None, bool | None]:
    """(HEAD's full sha, whether tracked files changed) of the checkout at `tree`; (None, None)
    where there is none (an installed package, no git)."""
    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None

    head = git("rev-parse", "--verify", "--quiet", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return head.stdout.strip(), dirty


def collect(device: str = "cpu", *, host_probe: dict[str, Any] | None = None,
            tree: Path = SOURCE_TREE) -> Provenance:
    from harness.machine import platform

    info = platform.detect(device)
    commit, dirty = git_state(tree)
    if commit is None:
        log.info("%s is not a git checkout: results record no commit", tree)
    return Provenance(commit=commit, dirty=dirty,
                      date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                      platform_id=info.id, cpu_class=info.capability, host_probe=host_probe,
                      software=software_versions())
