"""The stand-in: side by side, the arm that finishes its round first is replaced on its core by a
process doing the same kind of work, until the other arm finishes too, so that neither arm runs
the end of its round alone.

Why: both arms start a round together but seldom end it together, and an arm that runs alone
while the arms exchange cores runs slower than beside a partner (measured: docs/gate-studies.md,
"The stand-in"). A slower candidate then read slower still in the mode it ran
last, and which mode that is depends on the round's order.

The work: one thread streaming bf16 matrix-vector products over STREAM_MB of weights, in chunks of
a few milliseconds, as a decoding step streams a model's weights; between chunks it reads its
commands (`run`; `rest`, answered `rested` once it has stopped; `quit`). It is started once a
gate, in its own process group, dies with the gate, and the load guard counts it as one of the
gate's own processes. If it cannot start, or ends, the gate goes on without it and says so.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys

from harness.core import locks
from harness.perf.ab import duet
from harness.perf.ab.arms import end_process

log = logging.getLogger(__name__)

STREAM_MB = 256     # weights streamed per pass: well beyond the core's private caches
CHUNK_ROWS = 4096   # a 4096 x 4096 bf16 chunk is 32 MB: a few milliseconds of work
START_TIMEOUT_S = 120.0
REST_TIMEOUT_S = 10.0  # a chunk is milliseconds; this is for a stand-in that stopped answering


class StandIn:
    """The controller's side: start once, then `cover(...)` a finished arm's core and `rest()`."""

    def __init__(self, env: dict[str, str] | None = None):
        self.env = dict(env or {})  # the arms' thread settings: one thread
        self.process: subprocess.Popen | None = None
        self.running = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> bool:
        """Start the process and wait until its weights are in memory; False (logged) if it could not."""
        try:
            self.process = subprocess.Popen([*locks.dies_with_parent(), sys.executable, "-m", __name__],
                                            env={**os.environ, **self.env}, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True, start_new_session=True)
            ready = select.select([self.process.stdout], [], [], START_TIMEOUT_S)[0]
            if ready and self.process.stdout.readline().strip() == "ready":
                return True
            why = "it did not get ready in time" if not ready else f"it ended ({self.process.poll()})"
        except OSError as exc:
            why = str(exc)
        log.warning("side by side without a stand-in (%s): an arm that finishes its round last runs its end alone", why)
        self.close(ask=False)
        return False

    def _say(self, command: str) -> bool:
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError, AttributeError):
            return False

    def cover(self, pid: int, where: duet.Swapping | int) -> bool:
        """Take the core of arm `pid`, which has finished its round: its place in the exchange
        (a Swapping), or core `where` (no exchange within the round), and start working; False
        where it could not (logged)."""
        if self.process is None:
            return False
        if self.process.poll() is not None:
            log.warning("the stand-in ended (%s); side by side without it from now on", self.process.poll())
            self.close(ask=False)
            return False
        try:
            if isinstance(where, duet.Swapping):
                where.substitute(pid, self.process.pid)
            else:
                duet.pin(self.process.pid, where)
        except (duet.DuetError, ValueError) as exc:
            log.warning("the stand-in cannot take arm %d's core (%s); it rests this round", pid, exc)
            return False
        self.running = self._say("run")
        if not self.running and isinstance(where, duet.Swapping):
            self.release(pid, where)  # it cannot work: the arm keeps its place in the exchange
        return self.running

    def release(self, pid: int, where: duet.Swapping | int) -> None:
        """Stop working and give arm `pid` its place back (it covered the arm's core while the arm
        waited for the other between two runs of a round: harness/perf/ab/gate.py)."""
        standin = self.pid
        self.rest()
        if isinstance(where, duet.Swapping) and standin is not None:
            try:
                where.substitute(standin, pid)
            except (duet.DuetError, ValueError) as exc:
                log.warning("arm %d cannot take its place back from the stand-in (%s)", pid, exc)

    def rest(self) -> None:
        """Stop working, and wait until it has (so that its last chunk stays out of the next round)."""
        if not self.running:
            return
        self.running = False
        p = self.process
        if self._say("rest") and select.select([p.stdout], [], [], REST_TIMEOUT_S)[0] \
                and p.stdout.readline().strip() == "rested":
            return
        why = f"it ended ({p.poll()})" if p.poll() is not None else "it did not stop when told"
        log.warning("the stand-in is gone (%s); side by side without it from now on", why)
        self.close(ask=False)

    def close(self, *, ask: bool = True) -> None:
        """Ask it to quit (ask=False: kill it at once); kill its process group if it does not within seconds."""
        p, self.process, self.running = self.process, None, False
        if p is not None:
            end_process(p, "quit" if ask else None)


def work() -> None:
    """The stand-in process: rest until told to run; run chunk by chunk until told to rest or quit."""
    import torch

    torch.set_num_threads(1)
    chunks = [torch.full((CHUNK_ROWS, CHUNK_ROWS), 0.01, dtype=torch.bfloat16)
              for _ in range(max(1, STREAM_MB * 2**20 // (CHUNK_ROWS * CHUNK_ROWS * 2)))]
    x = torch.full((CHUNK_ROWS,), 0.01, dtype=torch.bfloat16)
    print("ready", flush=True)
    fd, buffer, running, n = sys.stdin.fileno(), b"", False, 0
    while True:
        if select.select([fd], [], [], None if not running else 0)[0]:
            data = os.read(fd, 4096)
            if not data:
                return  # the controller is gone
            buffer += data
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                command = line.decode().strip()
                if command == "quit":
                    return
                if command == "rest" and running:
                    print("rested", flush=True)
                running = command == "run"
            continue
        torch.mv(chunks[n % len(chunks)], x)
        n += 1


if __name__ == "__main__":
    work()
