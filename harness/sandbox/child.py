"""The program that runs inside the sandbox (harness/sandbox/execute.py starts it; never imported by the harness).

Standard library only; it runs under `python -I -S -B` inside the OS containment. Protocol:

  argv: JOB_FD RESULT_FD
  JOB_FD     a pipe from the parent carrying one JSON job, read to EOF and closed before any
             untrusted code runs: {"secret", "units": [[name, source, trusted], ...],
             "call": [check_name, entry_point] | null, "rlimits": {...}, "workdir"}
  RESULT_FD  a pipe to the parent. The only output that means "passed" is
             b"PASS " + secret + b"\\n", written after every unit ran and the call returned. Failures
             write b"FAIL " + a one-line reason; they are advisory (the parent fails anything else).

The secret is a fresh random value per run. It never appears in the program text, the command
line, the environment or a file; it lives only in a local variable of `main` from the moment the
job pipe is read and closed. Before the first untrusted unit runs, an audit hook (PEP 578) is
installed that refuses the ways Python code reaches another frame's locals or the process memory
(frames, tracebacks' frames, generator frames, tracing/profiling, gc walks, code objects, ctypes,
signals, /proc), starting processes, sending signals, sockets, raising resource limits and writes
outside the working directory. Each unit is compiled separately before any of them runs, so a
completion cannot swallow the tests (an unterminated string is a SyntaxError of its own unit).
The trusted units and the final call see a copy of `builtins` taken before untrusted code ran.
"""

import builtins
import json
import os
import resource
import sys

_DENIED_IMPORTS = frozenset({
    "ctypes", "_ctypes", "cffi", "_cffi_backend", "signal", "_signal", "subprocess", "_posixsubprocess",
    "multiprocessing", "_multiprocessing", "_posixshmem", "socket", "_socket", "ssl", "_ssl", "mmap",
    "pty", "faulthandler", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
    "_testbuffer", "_testmultiphase", "_testimportmultiple", "_testsinglephase", "_tracemalloc",
    "tracemalloc", "_lsprof", "cProfile", "profile", "pdb", "bdb", "trace", "readline", "_tkinter",
})
_DENIED_EVENTS = frozenset({
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "sys.addaudithook", "sys.monitoring.register_callback", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "object.__getattr__", "code.__new__", "function.__new__", "marshal.load",
    "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "resource.setrlimit", "resource.prlimit", "mmap.__new__",
    "os.startfile", "webbrowser.open", "cpython.run_command", "cpython.run_module", "cpython.run_file",
    "cpython.run_interactivehook", "cpython.run_startup", "cpython.PyInterpreterState_New",
    "setopencookie",
})
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
    "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copymode",
    "shutil.copystat", "shutil.copytree", "shutil.chown", "shutil.make_archive", "shutil.unpack_archive",
    "tempfile.mkstemp", "tempfile.mkdtemp", "os.chdir", "os.chroot", "os.lockf",
})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxDenied(RuntimeError):
    """Raised by the audit hook. A RuntimeError, so `sys.addaudithook` refuses new hooks quietly."""


class FrameDenied(ValueError):
    """sys._getframe refused: a ValueError, which the standard library treats as 'no such frame'
    (collections.namedtuple, enum, typing fall back to '__main__')."""


def _make_hook(workdir: str, stdlib_dirs: tuple, get_ident):
    """The audit hook. It holds no secret: it only decides what untrusted code may do."""
    # Each check is a closure built before untrusted code runs and held only in the hook's closure
    # cells, with its state (the threads inside the hook, the last .pyc opened): untrusted code has
    # no reference through which to reach or replace them.
    busy = set()
    inside = workdir.rstrip("/") + "/"
    under, resolve = _path_tests()
    check_import = _import_check(stdlib_dirs, under, resolve)
    check_open, check_marshal = _open_and_marshal_checks(inside, stdlib_dirs, under, resolve)
    check_path_event = _path_event_check(inside, under, resolve)

    def hook(event, args):
        """Raise for an event the policy refuses; pass events that the hook's own work raises."""
        ident = get_ident()
        if ident in busy:  # an event raised by the hook's own work (its open of a .pyc)
            return
        busy.add(ident)
        try:
            if event in _DENIED_EVENTS or event.startswith(("ctypes.", "socket.")):
                if event == "sys._getframe":
                    raise FrameDenied("sandbox: frame introspection is not allowed")
                raise SandboxDenied(f"sandbox: {event} is not allowed")
            if event == "import":
                check_import(args)
            elif event == "open":
                check_open(args)
            elif event == "marshal.loads":
                check_marshal(args)
            elif event in _PATH_EVENTS:
                check_path_event(event, args)
        finally:
            busy.discard(ident)

    return hook


def _path_tests():
    """(under, resolve): path tests over os and builtins functions captured before untrusted code runs."""
    realpath, fspath, isinstance_, str_, bytes_ = os.path.realpath, os.fspath, isinstance, str, bytes

    def under(path, root):
        return path == root.rstrip("/") or path.startswith(root)

    def resolve(p):
        try:
            p = fspath(p)
        except TypeError:
            return None
        if isinstance_(p, bytes_):
            p = p.decode("utf-8", "surrogateescape")
        return realpath(p) if isinstance_(p, str_) else None

    return under, resolve


def _import_check(stdlib_dirs: tuple, under, resolve):
    """The "import" check: no denied module, and no module file from outside the standard library."""

    def check_import(args):
        name, filename = args[0], args[1]
        if name.split(".")[0] in _DENIED_IMPORTS:
            raise SandboxDenied(f"sandbox: import of {name} is not allowed")
        if filename is not None:
            real = resolve(filename)
            if real is None or not any(under(real, d) for d in stdlib_dirs):
                raise SandboxDenied(f"sandbox: loading {name} from {filename} is not allowed")

    return check_import


def _open_and_marshal_checks(inside: str, stdlib_dirs: tuple, under, resolve):
    """The "open" and "marshal.loads" checks, which share the last standard library .pyc opened:
    marshal.loads is allowed only for that file's exact bytes (no crafted code objects)."""
    last_pyc = [None]
    isinstance_, str_, bytes_, int_ = isinstance, str, bytes, int

    def check_open(args):
        path, mode, flags = args
        if isinstance_(path, int_):
            return
        real = resolve(path)
        if real is None:
            raise SandboxDenied("sandbox: open of this path is not allowed")
        if under(real, "/proc/") or under(real, "/sys/") or (
                under(real, "/dev/") and real not in ("/dev/null", "/dev/zero", "/dev/urandom")):
            raise SandboxDenied(f"sandbox: open of {real} is not allowed")
        if isinstance_(flags, int_) and flags & _WRITE_FLAGS or (mode and any(c in str_(mode) for c in "wax+")):
            if not under(real, inside):
                raise SandboxDenied(f"sandbox: writing {real} (outside the working directory) is not allowed")
        last_pyc[0] = real if real.endswith(".pyc") and any(under(real, d) for d in stdlib_dirs) else None

    def check_marshal(args):
        pyc, last_pyc[0] = last_pyc[0], None
        data = args[0]
        if pyc is None:
            raise SandboxDenied("sandbox: marshal.loads is not allowed")
        with open(pyc, "rb") as fh:
            if fh.read()[16:] != bytes_(data):
                raise SandboxDenied("sandbox: marshal.loads of crafted data is not allowed")

    return check_open, check_marshal


def _path_event_check(inside: str, under, resolve):
    """The check of events that name paths: every path inside the working directory, and no
    directory descriptor that paths could be relative to."""
    isinstance_, str_, bytes_, int_ = isinstance, str, bytes, int

    def check_path(event, p):
        real = resolve(p)
        if real is None or not under(real, inside):
            raise SandboxDenied(f"sandbox: {event} outside the working directory is not allowed")

    def check_path_event(event, args):
        for a in args:
            if isinstance_(a, (str_, bytes_)) or hasattr(a, "__fspath__"):
                check_path(event, a)
            elif isinstance_(a, int_) and a not in (-1,) and event not in ("os.chmod", "os.chown", "os.mkdir",
                                                                          "os.mkfifo", "os.mknod", "os.lockf",
                                                                          "os.truncate", "os.utime"):
                raise SandboxDenied(f"sandbox: {event} relative to a directory descriptor is not allowed")

    return check_path_event


def _stdlib_dirs() -> tuple:
    lib = os.path.dirname(os.path.realpath(os.__file__))
    dirs = {lib + "/"}
    for p in sys.path:
        if p and p.startswith(sys.base_prefix):
            dirs.add(os.path.realpath(p).rstrip("/") + "/")
    return tuple(sorted(dirs))


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def main() -> None:
    """Run the job; write the pass token only when every unit and the final call ran to the end."""
    # Captured before untrusted code runs: a program that replaced os.write would see the token.
    write, exit_, get_ident = os.write, os._exit, __import__("_thread").get_ident
    job_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    job = _read_job(job_fd)
    # The secret stays a local of this frame: no helper is given it, and the hook refuses frame access.
    secret = job.pop("secret").encode("ascii")
    fail = _fail_writer(write, exit_, result_fd)
    _apply_rlimits(job.get("rlimits", {}))
    units = _compile_units(job["units"], fail)
    call, workdir, audit_policy = job.get("call"), job["workdir"], job.get("audit_policy", True)
    del job

    pristine = dict(builtins.__dict__)
    _lock_down(workdir, audit_policy, get_ident)
    _run_units(units, call, pristine, fail)
    write(result_fd, b"PASS " + secret + b"\n")
    exit_(0)


def _read_job(job_fd: int) -> dict:
    """The job, read to EOF from its pipe, which is closed before any untrusted code runs."""
    raw = _read_all(job_fd)  # holds the secret; released with this frame
    os.close(job_fd)
    return json.loads(raw)


def _fail_writer(write, exit_, result_fd: int):
    """fail(reason): write a one-line FAIL to the result pipe and exit 1, over os functions captured early."""

    def fail(reason: str) -> None:
        try:
            write(result_fd, b"FAIL " + _one_line(reason).encode("utf-8", "replace") + b"\n")
        finally:
            exit_(1)

    return fail


def _apply_rlimits(rlimits: dict) -> None:
    """Set the job's resource limits (soft, hard) before any unit is compiled or run."""
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _compile_units(units: list, fail) -> list:
    """Compile every unit on its own before any runs, so a completion cannot swallow the tests."""
    compiled = []
    for name, source, trusted in units:
        try:
            compiled.append((name, compile(source, f"<{name}>", "exec", dont_inherit=True), bool(trusted)))
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
            fail(f"{name}: {type(exc).__name__}: {exc}")
    return compiled


def _lock_down(workdir: str, audit_policy: bool, get_ident) -> None:
    """Drop the signal modules from sys.modules and install the audit hook (unless the job turned it off)."""
    for mod in ("_signal", "signal"):
        sys.modules.pop(mod, None)
    if audit_policy:
        sys.addaudithook(_make_hook(workdir, _stdlib_dirs(), get_ident))


def _run_units(units: list, call, pristine: dict, fail) -> None:
    """Run the units in order in one namespace, then check(entry_point); any failure ends the process."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        for name, code, trusted in units:
            if trusted:  # trusted units see the builtins as they were before untrusted code ran
                trusted_ns = dict(namespace)
                trusted_ns["__builtins__"] = dict(pristine)
                exec(code, trusted_ns)
                namespace = trusted_ns
            else:
                exec(code, namespace)
        if call is not None:
            check_name, entry_point = call
            if check_name not in namespace:
                fail(f"NameError: the tests define no {check_name!r}")
            if entry_point not in namespace:
                fail(f"NameError: the program defines no {entry_point!r}")
            namespace[check_name](namespace[entry_point])
    except SystemExit as exc:
        fail(f"the program exited (SystemExit {exc.code!r}) before the tests finished")
    except BaseException as exc:  # noqa: BLE001 - every failure of untrusted code is a failed run
        try:
            message = str(exc)
            fail(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
        except BaseException:  # a hostile __str__
            fail(type(exc).__name__)


if __name__ == "__main__":
    main()
