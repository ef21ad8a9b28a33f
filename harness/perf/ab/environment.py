"""The Python environment an arm of the A/B gate runs in: its interpreter and the packages it sees.

The candidate runs in this environment (the interpreter running the gate). The base may run in
another one, so that a library upgrade is gated paired, in one job, like a commit:

    --perf-base-python PATH   an interpreter that exists (a virtual environment's bin/python)
    --perf-base-env SPEC      a pip requirement (`transformers==5.22.0`, a local wheel's path, several
                              separated by spaces) or a requirements file: the gate builds an overlay
                              of this environment in which SPEC is installed, cached under
                              <cache>/envs/<key> and reused while SPEC and this environment stay the same

An overlay is a virtual environment whose own site-packages come first and which sees this
environment's packages after them (a .pth file): the two environments differ only in what SPEC
installed, torch's multi-GB build is never copied, and a local wheel installs offline. It is built
in a temporary folder and renamed into place once pip and an import of torch and transformers
succeeded: a failed build keeps nothing. Every failure is one line naming the option and SPEC.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.core import cacheprune, locks
from harness.perf.ab.probe_environment import installed
from harness.core.errors import BadInputError
from harness.workload.models import cache_root, lock_file

log = logging.getLogger(__name__)

PYTHON_OPTION, SPEC_OPTION = "--perf-base-python", "--perf-base-env"
# the versions a result names for each arm (every other package is compared, and named where it differs)
REPORTED = ("python", "torch", "transformers", "tokenizers", "safetensors", "accelerate", "numpy")
PARTIAL = ".partial-"  # + owner pid + key: a build in progress (swept once its owner is gone)
PROBE_TIMEOUT_S, PIP_TIMEOUT_S = 300.0, 1800.0
PROBE = Path(__file__).with_name("probe_environment.py")  # run as a file: the standard library only


class ArmEnvironmentError(BadInputError):
    """An environment that cannot be used or built as an arm's."""


@dataclass(frozen=True)
class Environment:
    """An interpreter and what it imports: resolved once at the start of a run."""

    python: str                                   # the interpreter's path
    label: str                                    # "this environment", or the option that named it
    packages: Mapping[str, str] = field(default_factory=dict, compare=False)  # distribution -> version

    @property
    def versions(self) -> dict[str, str]:
        """The versions named in results: REPORTED, where installed."""
        return {name: self.packages[name] for name in REPORTED if name in self.packages}

    def differences(self, other: "Environment") -> dict[str, tuple[str | None, str | None]]:
        """Every distribution whose version differs: name -> (self's, other's), None where absent."""
        names = sorted(set(self.packages) | set(other.packages))
        return {n: (self.packages.get(n), other.packages.get(n)) for n in names
                if self.packages.get(n) != other.packages.get(n)}

    def to_json(self) -> dict[str, object]:
        return {"python": self.python, "label": self.label, "versions": self.versions}


def current() -> Environment:
    """This environment: the interpreter running the gate (the candidate's)."""
    return Environment(sys.executable, "this environment", installed())


def probe(python: str, label: str, option: str) -> Environment:
    """The environment of interpreter `python`, checked to import torch and transformers."""
    what = label if option == SPEC_OPTION else f"{option} {python}"
    try:
        r = subprocess.run([python, "-I", str(PROBE)], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                           cwd=PROBE.parent)
    except FileNotFoundError:
        raise ArmEnvironmentError(f"{what}: no such interpreter; give the path of a python executable "
                                "(a virtual environment's bin/python)") from None
    except PermissionError:
        raise ArmEnvironmentError(f"{what}: not an executable file; give the path of a python executable") from None
    except OSError as exc:
        raise ArmEnvironmentError(f"{what}: cannot run it ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise ArmEnvironmentError(f"{what}: importing torch and transformers took over {PROBE_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        raise ArmEnvironmentError(f"{what}: it cannot run a worker: {_last_error(r.stderr)}")
    try:
        packages = json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise ArmEnvironmentError(f"{what}: its probe printed no package list ({r.stdout[-200:]!r})") from None
    return Environment(python, label, packages)


def _last_error(stderr: str) -> str:
    """A traceback's last line (the exception), else the last line written."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def from_python(path: str) -> Environment:
    """--perf-base-python PATH, probed (not resolved through symlinks: a venv's python is one)."""
    return probe(str(Path(path).absolute()), f"{PYTHON_OPTION} {path}", PYTHON_OPTION)


def _pip_arguments(spec: str) -> list[str]:
    """A requirements file becomes `-r FILE`; anything else is requirements separated by spaces."""
    path = Path(spec)
    if path.is_file() and not spec.endswith((".whl", ".tar.gz", ".zip")):
        return ["-r", str(path.absolute())]
    return shlex.split(spec)


def _files_in(spec: str) -> dict[str, str]:
    """Each local file SPEC names (a requirements file, a wheel), by path -> sha256 of its bytes: an
    edited file is another environment."""
    out = {}
    for arg in _pip_arguments(spec):
        path = Path(arg)
        if path.is_file():
            out[str(path.absolute())] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def key(spec: str, parent: Environment) -> str:
    """The cache key of an overlay: SPEC (and the files it names) over this exact parent."""
    doc = {"spec": spec, "files": _files_in(spec), "parent": parent.python, "packages": dict(parent.packages)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def build(spec: str, parent: Environment | None = None, *, root: Path | None = None,
          say: Callable[[str], None] | None = None, label: str | None = None) -> Environment:
    """--perf-base-env SPEC: the overlay of `parent` (this environment) with SPEC installed, built
    once and then reused; `say` gets one line per step (the terminal), and each step is logged.
    `label` names the environment in those lines and in errors (default `--perf-base-env SPEC`)."""
    parent = parent or current()
    if not spec.strip():
        raise ArmEnvironmentError(f"{SPEC_OPTION}: empty; give a requirement (transformers==5.22.0), a wheel or a "
                                "requirements file")
    label = label or f"{SPEC_OPTION} {spec}"
    root = root or cache_root() / "envs"
    digest = key(spec, parent)
    final = root / digest
    python = str(final / "bin" / "python")

    def step(line: str) -> None:
        log.info("%s: %s", label, line)
        if say:
            say(f"{label}: {line}")

    root.mkdir(parents=True, exist_ok=True)
    # the lock guards the environment's folder: once that is gone (pruned), the lock file goes too
    with locks.held(lock_file(f"env-{digest}"), what=f"build of the environment of {label}", on_wait=say,
                    guards=final):
        locks.sweep(root, PARTIAL, remove=lambda p: shutil.rmtree(p, ignore_errors=True))
        prune(root, keep=final)
        if (final / "ready").is_file():
            step(f"reusing {final}")
            cacheprune.mark_used(final)
            return probe(python, label, SPEC_OPTION)
        if final.exists():  # not ready: a build that was stopped between rename and marker, or edited by hand
            shutil.rmtree(final)
        work = root / (locks.owned_name(PARTIAL) + digest)
        try:
            _make_overlay(work, parent, spec, step, label)
            built = probe(str(work / "bin" / "python"), label, SPEC_OPTION)
            (work / "ready").write_text(json.dumps({"spec": spec, "parent": parent.python}) + "\n")
            work.rename(final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        step(f"built in {final}")
        return dataclasses.replace(built, python=python)


def prune(root: Path, keep: Path | None = None) -> list[Path]:
    """Remove the built environments under `root` whose parent Python is gone (a deleted clone's
    .venv: an overlay runs on its parent's packages) or that were not used for
    cacheprune.UNUSED_DAYS; `keep` stays, and so does one being built or used for a build now."""
    entries = [p for p in sorted(Path(root).iterdir()) if p.is_dir() and not p.name.startswith(PARTIAL)] \
        if Path(root).is_dir() else []
    return cacheprune.prune(entries, keep=keep, orphan=_parent_gone, remove=_remove_if_free, what="base environment")


def _parent_gone(built: Path) -> bool:
    try:
        parent = json.loads((built / "ready").read_text()).get("parent")
    except (OSError, ValueError, AttributeError):
        return False  # not finished, or not ours: its age decides
    return isinstance(parent, str) and not Path(parent).exists()


def _remove_if_free(built: Path) -> bool:
    with locks.taken_if_free(lock_file(f"env-{built.name}"), guards=built) as free:
        if free:
            shutil.rmtree(built)
        return free


def _make_overlay(work: Path, parent: Environment, spec: str, step: Callable[[str], None], label: str) -> None:
    """A virtual environment at `work` that sees `parent`'s packages after its own, with SPEC installed."""
    step("creating a virtual environment over this one")
    made = subprocess.run([parent.python, "-m", "venv", "--without-pip", str(work)], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    if made.returncode != 0:
        raise ArmEnvironmentError(f"{label}: could not create a virtual environment: {_last_error(made.stderr)}")
    python = str(work / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S).stdout.strip()
    parent_sites = json.loads(subprocess.run(
        [parent.python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
        capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True).stdout)
    # addsitedir, not a bare path: the parent's own .pth files (editable installs) are read too
    Path(purelib, "_assisted_bench_parent.pth").write_text(
        "".join(f"import site; site.addsitedir({site!r})\n" for site in parent_sites))
    step(f"pip install {spec} (pip runs from this environment, installing into the overlay)")
    args = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
            *_pip_arguments(spec)]
    lines: list[str] = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONNOUSERSITE": "1"}) as pip:
        for line in pip.stdout:
            lines.append(line.rstrip())
            if line.startswith(("Collecting", "Processing", "Installing", "Successfully", "ERROR")):
                step(line.strip())
        code = pip.wait(timeout=PIP_TIMEOUT_S)
    if code != 0:
        raise ArmEnvironmentError(f"{label}: {_pip_failure(lines)}; no environment was kept")


def _pip_failure(lines: list[str]) -> str:
    """What pip could not install, from its ERROR lines: the package and pip's reason."""
    errors = [line[len("ERROR:"):].strip() for line in lines if line.startswith("ERROR:")]
    reason = errors[-1] if errors else (lines[-1] if lines else "pip failed with no message")
    match = re.search(r"(?:distribution found for|satisfies the requirement|Invalid requirement:?) '?([^\s'(]+)",
                      " ".join(errors))
    return f"pip could not install {match.group(1)}: {reason}" if match else f"pip failed: {reason}"
