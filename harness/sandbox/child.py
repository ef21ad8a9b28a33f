"""The program that runs inside the sandbox (harness/sandbox/execute.py starts it; never imported by the harness).

Standard library only; it runs under `python -I -S -B` inside the OS containment. Protocol:

  argv: JOB_FD RESULT_FD
  JOB_FD     a pipe from the parent carrying one JSON job, read to EOF and closed before any
             untrusted code runs: {"secret", "units": [[name, source, trusted], ...],
             "call": [check_name, entry_point] | null, "rlimits": {...}, "workdir",
             "jail": jail.py's spec | null, "audit_policy"}
  RESULT_FD  a pipe to the parent. First, before any untrusted code runs, b"READY\n" (or
             b"ERROR <reason>\n" when the jail could not be built: the sandbox's failure, not the
             program's). Then the only output that means "passed" is b"PASS " + secret + b"\n",
             written after every unit ran and the call returned. Failures write b"FAIL " + a one-line
             reason; they are advisory (the parent fails anything else).

With a jail (backend unshare), stage 0 (jail.py) runs first, as root in fresh namespaces: a private
root filesystem, then uid 65534 with no capabilities.
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
import io
import json
import os
import pickle
import resource
import struct
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
    """The judge: enter the jail, fork the program's process before the job is read, then run the
    trusted units here and the untrusted ones there; the pass token is written only here, only
    after the call returned."""
    # Captured before anything else runs.
    write, exit_ = os.write, os._exit
    job_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    workdir = _enter_jail(json.loads(sys.argv[3]) if len(sys.argv) > 3 else None, write, exit_, result_fd)
    # Forked before the job is read: the program's memory never holds the secret or the tests, and
    # it keeps none of this process's descriptors but its own two pipe ends.
    program = _Program.fork(close=(job_fd, result_fd))
    job = _read_job(job_fd)
    secret = job.pop("secret").encode("ascii")  # a local of this frame only
    fail = _fail_writer(write, exit_, result_fd)
    # The first line on the result pipe, written before any untrusted code runs: whatever the
    # program could write comes after it, so it cannot pass itself off as a failure of the sandbox.
    write(result_fd, b"READY\n")
    _apply_rlimits(job["rlimits"])
    trusted = _compile_units([u for u in job["units"] if u[2]], fail)
    program.start({"units": [u for u in job["units"] if not u[2]], "rlimits": job["rlimits"],
                   "workdir": workdir or job["workdir"], "audit_policy": job.get("audit_policy", True)})
    call = job.get("call")
    del job
    _judge(trusted, call, program, fail)
    write(result_fd, b"PASS " + secret + b"\n")
    exit_(0)


def _read_job(job_fd: int) -> dict:
    """The job, read to EOF from its pipe, which is closed before any untrusted code runs."""
    raw = _read_all(job_fd)  # holds the secret; released with this frame
    os.close(job_fd)
    return json.loads(raw)


def _enter_jail(spec, write, exit_, result_fd: int):
    """Stage 0 (backend unshare): the private root and the unprivileged user of jail.py, entered
    before anything else; None without a jail. A failure is the sandbox's, reported as ERROR."""
    if not spec:
        return None
    try:
        import importlib.util

        where = importlib.util.spec_from_file_location("_jail", os.path.join(os.path.dirname(__file__), "jail.py"))
        jail = importlib.util.module_from_spec(where)
        where.loader.exec_module(jail)
        workdir = jail.enter(spec)
    except BaseException as exc:  # noqa: BLE001 - any failure here means the run is not contained
        write(result_fd, b"ERROR " + _one_line(f"{type(exc).__name__}: {exc}").encode("utf-8", "replace") + b"\n")
        exit_(3)
    # ctypes was the jail's tool only: out of sys.modules, so that importing it again meets the audit hook
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes", "_jail")]:
        del sys.modules[name]
    return workdir


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
    for name, source, _trusted in units:
        try:
            compiled.append((name, compile(source, f"<{name}>", "exec", dont_inherit=True)))
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
            fail(f"{name}: {type(exc).__name__}: {exc}")
    return compiled


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
        return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return type(exc).__name__


def _judge(units: list, call, program, fail) -> None:
    """The trusted units (the tests, and the task's own context) run here, in this process, with the
    program's entry point as a stand-in that calls into the program's process and gets back plain data."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        for _name, code in units:
            exec(code, namespace)
        defined = program.loaded()
        if call is not None:
            check_name, entry_point = call
            if check_name not in namespace:
                fail(f"NameError: the tests define no {check_name!r}")
            if entry_point not in defined:
                fail(f"NameError: the program defines no {entry_point!r}")
            candidate = program.function(entry_point)
            namespace[entry_point] = candidate
            namespace[check_name](candidate)
    except ProgramFailed as exc:
        fail(str(exc))
    except SystemExit as exc:
        fail(f"the tests exited (SystemExit {exc.code!r})")
    except BaseException as exc:  # noqa: BLE001 - every failure of the tests is a failed run
        fail(_describe(exc))


# --------------------------------------------------------------------------------------------
# The program's process and the channel to it. Messages are length-prefixed pickles. The judge
# reads the program's with _PlainData, which builds only plain values (no class of the program's,
# so no rigged __eq__), and at most MAX_MESSAGE bytes of them.
# --------------------------------------------------------------------------------------------
MAX_MESSAGE = 64 << 20


class ProgramFailed(Exception):
    """The program's process failed, exited or answered with something that is not plain data."""


class _PlainData(pickle.Unpickler):
    ALLOWED = {("builtins", n) for n in ("complex", "set", "frozenset", "bytearray", "range", "slice", "int",
                                          "float", "str", "bytes", "list", "dict", "tuple", "bool")} | \
              {("collections", n) for n in ("OrderedDict", "defaultdict", "Counter", "deque")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the program returned a {module}.{name}, which is not plain data")


def _send(fd: int, obj) -> None:
    data = pickle.dumps(obj)
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int, plain: bool):
    """The next message, or None at the end of the stream."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    (size,) = struct.unpack("<Q", head)
    if size > MAX_MESSAGE:
        raise ProgramFailed(f"the program sent {size} bytes, more than {MAX_MESSAGE}")
    data = _read_exactly(fd, size)
    if data is None:
        return None
    return _PlainData(io.BytesIO(data)).load() if plain else pickle.loads(data)


def _read_exactly(fd: int, n: int):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Program:
    """The judge's handle on the program's process."""

    def __init__(self, to_program: int, from_program: int):
        self.to_program, self.from_program = to_program, from_program

    @classmethod
    def fork(cls, close: tuple) -> "_Program":
        inbox_r, inbox_w = os.pipe()
        outbox_r, outbox_w = os.pipe()
        if os.fork() == 0:
            keep = sorted((inbox_r, outbox_w))
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[1])
            os.closerange(keep[1] + 1, 1 << 16)
            _program_process(inbox_r, outbox_w)  # never returns
        for fd in (inbox_r, outbox_w):
            os.close(fd)
        return cls(inbox_w, outbox_r)

    def start(self, job: dict) -> None:
        _send(self.to_program, job)

    def _reply(self):
        try:
            reply = _receive(self.from_program, plain=True)
        except ProgramFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - anything the program sent that is not a plain message
            raise ProgramFailed(_describe(exc)) from None
        if reply is None:
            raise ProgramFailed("the program exited before the tests finished")
        if not isinstance(reply, tuple) or not reply or not isinstance(reply[0], str):
            raise ProgramFailed("the program's process answered out of turn")
        if reply[0] == "error" and len(reply) == 2:
            raise ProgramFailed(str(reply[1]))
        return reply

    def loaded(self) -> frozenset:
        reply = self._reply()
        if reply[0] != "loaded" or len(reply) != 2:
            raise ProgramFailed("the program's process answered out of turn")
        return frozenset(name for name in reply[1] if isinstance(name, str))

    def function(self, name: str):
        def candidate(*args, **kwargs):
            _send(self.to_program, ("call", name, args, kwargs))
            reply = self._reply()
            if reply[0] == "return" and len(reply) == 2:
                return reply[1]
            if reply[0] == "raise" and len(reply) == 3:
                raise _rebuilt(str(reply[1]), str(reply[2]))
            raise ProgramFailed("the program's process answered out of turn")

        candidate.__name__ = candidate.__qualname__ = name
        return candidate


def _rebuilt(type_name: str, message: str) -> Exception:
    """The program's exception, as a builtin exception of the same type where there is one."""
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a builtin whose constructor wants other arguments
            pass
    return RuntimeError(f"{type_name}: {message}")


def _program_process(inbox: int, outbox: int) -> None:
    """The untrusted side: compile and run the program's units under the audit hook, then answer
    each call of one of its functions with ("return", value) or ("raise", type, message)."""
    exit_, get_ident = os._exit, __import__("_thread").get_ident
    send = _send
    job = _receive(inbox, plain=False)
    if job is None:  # the judge failed before sending the job
        exit_(0)
    _apply_rlimits(job["rlimits"])
    namespace = {"__name__": "__main__", "__builtins__": builtins}

    def fail(reason: str) -> None:
        send(outbox, ("error", reason))
        exit_(1)

    try:
        units = _compile_units(job["units"], fail)
        _lock_down(job["workdir"], job["audit_policy"], get_ident)
        del job
        for _name, code in units:
            exec(code, namespace)
        send(outbox, ("loaded", [k for k, v in namespace.items() if callable(v)]))
    except SystemExit as exc:
        send(outbox, ("error", f"the program exited (SystemExit {exc.code!r}) before the tests finished"))
        exit_(1)
    except BaseException as exc:  # noqa: BLE001 - every failure of untrusted code is a failed run
        send(outbox, ("error", _describe(exc)))
        exit_(1)
    while True:
        message = _receive(inbox, plain=False)
        if message is None:
            exit_(0)
        _, name, args, kwargs = message
        try:
            reply = ("return", namespace[name](*args, **kwargs))
        except SystemExit as exc:
            send(outbox, ("error", f"the program exited (SystemExit {exc.code!r}) before the tests finished"))
            exit_(1)
        except BaseException as exc:  # noqa: BLE001
            reply = ("raise", type(exc).__name__, _describe(exc).partition(": ")[2])
        try:
            send(outbox, reply)
        except BaseException as exc:  # noqa: BLE001 - a value pickle cannot carry
            send(outbox, ("error", f"the program returned a value that cannot leave its process ({_describe(exc)})"))
            exit_(1)


def _lock_down(workdir: str, audit_policy: bool, get_ident) -> None:
    """Drop the signal modules from sys.modules and install the audit hook (unless the job turned it off)."""
    for mod in ("_signal", "signal"):
        sys.modules.pop(mod, None)
    if audit_policy:
        sys.addaudithook(_make_hook(workdir, _stdlib_dirs(), get_ident))


if __name__ == "__main__":
    main()
