"""An arm of the A/B gate: one worker process (harness/perf/ab/worker.py) running one tree's code
in one Python environment (harness/perf/ab/environment.py: this one, or the base's own).

The controller talks to it in JSON lines with a timeout on every answer. A worker that crashes,
hangs or answers with an error ends the gate with one line naming the arm, its commit and its log
file. Workers run in their own process group, and `close` kills the group: no worker outlives
the gate, whatever ends it.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.core import locks
from harness.core.childenv import python_path
from harness.core.errors import UnsupportedHereError
from harness.workload.models import cache_root
from harness.perf.ab.environment import Environment, current
from harness.perf.ab.revision import Tree
from harness.perf.ab.worker import PROTOCOL

log = logging.getLogger(__name__)



class ArmError(UnsupportedHereError):
    """A worker that failed, hung or spoke another protocol."""


LOG_PREFIX = "ab-arm-"  # + owner pid: the logs of a killed gate are swept by the next (harness/core/locks.py)


def end_process(p: subprocess.Popen, quit_line: str | None, wait_s: float = 10.0) -> None:
    """End a child started in its own process group: send `quit_line` and wait up to wait_s for it
    to exit (None: not asked), then kill the group; its pipes closed."""
    if quit_line is not None and p.poll() is None:
        try:
            p.stdin.write(quit_line + "\n")
            p.stdin.flush()
            p.wait(timeout=wait_s)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)
    for stream in (p.stdin, p.stdout):
        try:
            if stream:
                stream.close()
        except OSError:
            pass


def first_to_answer(arms: list[Arm], timeout_s: float) -> Arm | None:
    """The first of the running arms with something to read (a full line buffered, or its pipe
    readable: an answer, or an end that receive() reports), within timeout_s; None if none."""
    waiting = [a for a in arms if a.answer_waiting()]
    if waiting:
        return waiting[0]
    ready = select.select(arms, [], [], timeout_s)[0]
    return ready[0] if ready else None


class Arm:
    """One worker process: start, request, restart, close."""

    def __init__(self, name: str, tree: Tree, *, timeout_s: float = 1800.0, env: dict[str, str] | None = None,
                 environment: Environment | None = None):
        self.name, self.tree, self.timeout_s = name, tree, timeout_s
        self.environment = environment or current()  # the interpreter the worker runs under
        self.env = dict(env or {})  # set for the worker on top of ours (duet: one thread per pool)
        self.process: subprocess.Popen | None = None
        locks.sweep(Path(tempfile.gettempdir()), LOG_PREFIX)
        self.log_path = Path(tempfile.mkstemp(prefix=locks.owned_name(LOG_PREFIX) + f"{name}-", suffix=".log")[1])
        self.failed = False  # an ArmError was raised: its message names the log, which is then kept
        self._buffer = b""  # what the worker wrote after the last full line
        self.starts = 0
        self.features: frozenset[str] = frozenset()  # what its worker can do beyond the protocol (worker.FEATURES)

    @property
    def label(self) -> str:
        where = "" if self.environment.python == sys.executable else f", {self.environment.label}"
        return f"{self.name} ({self.tree.label}, {self.tree.commit[:12]}{where})"

    def start(self) -> None:
        # the tree's harness first; another environment's own packages must win over this one's PYTHONPATH
        path = python_path(self.tree.path, inherit=self.environment.python == sys.executable)
        env = {**os.environ, **self.env, "PYTHONPATH": path, "HARNESS_CACHE_DIR": str(cache_root())}
        with open(self.log_path, "a", encoding="utf-8") as err:
            self.process = subprocess.Popen([*locks.dies_with_parent(), self.environment.python, "-m", self.tree.worker],
                                            cwd=self.tree.path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=err, text=True, start_new_session=True)
        self._buffer = b""
        self.starts += 1
        hello = self.request({"op": "hello"}, timeout_s=300)
        if hello.get("protocol") != PROTOCOL:
            self.close()
            raise self._error(f"{self.label}: its worker speaks protocol {hello.get('protocol')}, this gate {PROTOCOL}; "
                              "compare against a revision of the same protocol")
        self.features = frozenset(hello.get("features") or ())  # none from a worker that predates them
        if Path(str(hello.get("harness"))).resolve() != (self.tree.path / "harness").resolve():
            self.close()
            raise self._error(f"{self.label}: the worker imported {hello.get('harness')}, not its tree's harness; is "
                              f"PYTHONPATH overridden? (log: {self.log_path})")

    def _error(self, message: str) -> ArmError:
        self.failed = True
        return ArmError(message)

    def request(self, message: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request, wait for its answer (at most timeout_s), raise ArmError on failure."""
        self.send(message)
        return self.receive(message["op"], timeout_s=timeout_s)

    def send(self, message: dict[str, Any]) -> None:
        """Send one request without waiting (side-by-side rounds send to both arms, then receive)."""
        p = self.process
        if p is None or p.poll() is not None:
            raise self._error(f"{self.label}: the worker is not running ({self._exit()}; log: {self.log_path})")
        try:
            p.stdin.write(json.dumps(message) + "\n")
            p.stdin.flush()
        except BrokenPipeError:
            raise self._error(f"{self.label}: the worker died ({self._exit()}; log: {self.log_path})") from None

    def receive(self, op: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The answer to the request `op` sent last; ArmError when it failed or did not come."""
        line = self._read_line(timeout_s or self.timeout_s, op)
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            self.close(ask=False)
            raise self._error(f"{self.label}: answered {op} with a line that is not JSON: {line[:120]!r} "
                              f"(log: {self.log_path})") from None
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise self._error(f"{self.label}: {op} failed: {error} (log: {self.log_path})")
        return answer

    def _read_line(self, timeout_s: float, op: str) -> str:
        """One line from the worker within the deadline, read from its pipe without ever blocking past
        it: a worker that wrote half a line and stopped is an error, not a hang."""
        p = self.process
        fd = p.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                partial, self._buffer = self._buffer, b""
                self.close(ask=False)
                what = (f"wrote part of a line ({partial[:120].decode('utf-8', 'replace')!r}) and then nothing" if partial
                        else "gave no answer")
                raise self._error(f"{self.label}: {what} to {op} in {timeout_s:.0f} s; the worker was killed "
                                  f"(log: {self.log_path})")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                partial, self._buffer = self._buffer, b""
                p.wait(timeout=10)
                during = f" after part of a line ({partial[:120].decode('utf-8', 'replace')!r})" if partial else ""
                raise self._error(f"{self.label}: the worker died during {op}{during} ({self._exit()}; "
                                  f"log: {self.log_path})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def fileno(self) -> int:
        """The worker's answers' pipe (for select)."""
        return self.process.stdout.fileno()

    def answer_waiting(self) -> bool:
        """A full line from the worker is buffered (a receive() would not wait)."""
        return b"\n" in self._buffer

    def _exit(self) -> str:
        code = self.process.poll() if self.process else None
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
        return f"exit status {code}"

    def close(self, *, ask: bool = True) -> None:
        """Ask the worker to quit; kill its process group if it does not within seconds (at once
        with ask=False: a worker that broke the protocol is not asked)."""
        p, self.process = self.process, None
        if p is not None:
            end_process(p, json.dumps({"op": "quit"}) if ask else None)

    def discard_log(self) -> None:
        """At the end of a gate: the worker's log goes unless an error pointed the user to it."""
        if not self.failed:
            self.log_path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.close()
        time.sleep(0.1)
        self.start()
