"""A reproducible noisy neighbour: bursts of CPU and memory-bandwidth load on the cores a gate runs on,
the way a co-tenant of a shared VM loads them.

One load process per core, pinned to it. Each alternates a busy burst (streaming copies through a
buffer larger than the caches, so it takes memory bandwidth as well as the core) with an idle gap;
burst lengths are drawn around --burst-ms and gaps set so that the busy share is --duty. The cores'
bursts are independent, so an arm's core is loaded at some moments and not at others, as on a host
whose other guests come and go. Seeded: the same options give the same schedule.

    python benchmarks/noisy_host.py --duty 0.3 --burst-ms 200 -- make perf-ab     # a gate under load
    python benchmarks/noisy_host.py --duty 0.3 --seconds 60                        # load alone, 60 s

With a command after `--`, the neighbour runs it, with HARNESS_NOISY_HOST naming the load processes
in its environment (the A/B gate's load guard then counts their CPU as noise the gate must face,
not as a disturbance to measure again), and stops when the command ends; its exit status is the
command's. The load never outlives its run: it ends on exit, Ctrl-C, SIGTERM, and (through the
kernel's parent-death signal) when this process is killed. The command runs in a process group of its
own: a stop, whether sent to this process or to its whole group, reaches it once, as SIGTERM from
here, so its own clean-up runs to the end (or from the kernel, when this process is killed outright).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.perf.ab.loadguard import NOISE_ENV  # noqa: E402  (the variable the load guard reads)

log = logging.getLogger("noisy_host")

PR_SET_PDEATHSIG = 1


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duty", type=float, default=0.3, help="busy share of each core, above 0 and at most 1 (default 0.3)")
    p.add_argument("--burst-ms", type=float, default=200.0, help="mean length of a busy burst, 1-60000 ms (default 200)")
    p.add_argument("--memory-mb", type=int, default=64,
                   help="buffer each load process streams through, 0-4096 MiB; 0: CPU load only (default 64)")
    p.add_argument("--cores", default=None, help="cores to load, e.g. 0,1 (default: every core this process may use)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long (default: when the command ends, "
                                                                 "or at Ctrl-C)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # internal: the load of one core
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)  # internal: the neighbour's pid
    args = p.parse_args(argv)
    bad = None
    if not 0 < args.duty <= 1:
        bad = f"--duty: {args.duty}: give a busy share above 0 and at most 1, e.g. 0.3"
    elif not 1 <= args.burst_ms <= 60000:
        bad = f"--burst-ms: {args.burst_ms}: give a burst length between 1 and 60000 ms"
    elif not 0 <= args.memory_mb <= 4096:
        bad = f"--memory-mb: {args.memory_mb}: give 0 to 4096 MiB"
    elif args.seconds is not None and not args.seconds > 0:
        bad = f"--seconds: {args.seconds}: give a duration above 0"
    if bad is None:
        try:
            args.cores = cores(args.cores)
        except ValueError as exc:
            bad = f"--cores: {exc}"
    if bad:
        p.error(bad)
    return args, command


def cores(spec: str | None) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if spec is None:
        return allowed
    try:
        chosen = [int(c) for c in spec.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"{spec!r}: give core numbers separated by commas, e.g. 0,1") from None
    outside = [c for c in chosen if c not in allowed]
    if not chosen or outside:
        raise ValueError(f"{spec!r}: this process may use cores {allowed}")
    return chosen


def stop_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends `signum` to this process when its parent dies, however it dies; and if
    the parent died before that was set (this process then has another parent), end now."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(0)


def load(core: int, duty: float, burst_ms: float, memory_mb: int, seed: int, parent: int) -> None:
    """One core's load, until killed: bursts of streaming copies, gaps of sleep."""
    stop_with_parent(parent)
    os.sched_setaffinity(0, {core})
    rng = random.Random(seed * 1009 + core)
    size = max(1, memory_mb) * (1 << 20)
    src, dst = bytearray(os.urandom(1 << 16)) * (size >> 16), bytearray(size)
    view_src, view_dst = memoryview(src), memoryview(dst)
    chunk = 1 << 20
    while True:
        burst = rng.expovariate(1 / burst_ms) / 1000
        until = time.perf_counter() + burst
        offset = 0
        while time.perf_counter() < until:
            if memory_mb:
                view_dst[offset:offset + chunk] = view_src[offset:offset + chunk]
                offset = (offset + chunk) % size
            else:
                sum(range(2000))
        time.sleep(burst * (1 - duty) / duty)


class Neighbour:
    """The load processes, one per core; `stop` ends every one of them."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        a = self.args
        for core in a.cores:
            self.processes.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", str(core), "--duty", str(a.duty), "--burst-ms", str(a.burst_ms),
                 "--memory-mb", str(a.memory_mb), "--seed", str(a.seed), "--parent", str(os.getpid())]))
        log.info("noisy host: %d load process(es) on cores %s, duty %.0f%%, bursts ~%.0f ms, %d MiB each (pids %s)",
                 len(self.processes), a.cores, a.duty * 100, a.burst_ms, a.memory_mb, self.pids())

    def pids(self) -> str:
        return ",".join(str(p.pid) for p in self.processes)

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.kill()
        for p in self.processes:
            p.wait()
        self.processes = []


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(argv)
    if args.worker is not None:
        load(args.worker, args.duty, args.burst_ms, args.memory_mb, args.seed, args.parent)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    neighbour = Neighbour(args)

    starting = {"now": False, "stop": False}  # a stop while the command is being started waits for its pid

    def stop(signum: int, frame: object) -> None:
        if starting["now"]:
            starting["stop"] = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C too, set here: a process started in the background by a shell inherits SIGINT ignored
    # and Python then leaves it so
    signal.signal(signal.SIGINT, stop)
    code, child, parent = 0, None, os.getpid()
    try:
        neighbour.start()
        if command:
            env = {**os.environ, NOISE_ENV: neighbour.pids()}
            # a signal between the fork and Popen's return would leave a command no one stops
            starting["now"] = True
            try:
                # its own process group: a stop sent to ours (a cancelled job, `kill -- -PGID`) reaches
                # the command once, forwarded below, not twice, whatever the command makes of a
                # second; and SIGTERM if this process dies outright
                child = subprocess.Popen(command, env=env, process_group=0,
                                         preexec_fn=lambda: stop_with_parent(parent, signal.SIGTERM))
            finally:
                starting["now"] = False
            if starting["stop"]:
                raise KeyboardInterrupt
            try:
                code = child.wait(timeout=args.seconds)
            except subprocess.TimeoutExpired:
                log.info("noisy host: --seconds %.0f reached; stopping the command", args.seconds)
                child.terminate()
                code = child.wait()
        else:
            deadline = None if args.seconds is None else time.monotonic() + args.seconds
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.5)
    except KeyboardInterrupt:
        code = 130
    finally:
        if child is not None and child.poll() is None:  # stopped early: the command stops with it
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        neighbour.stop()
        log.info("noisy host: stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
