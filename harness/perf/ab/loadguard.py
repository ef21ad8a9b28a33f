"""The load guard: did another process (or the hypervisor) take CPU while a round ran?

Read /proc/stat around a round: the machine's busy time minus what the gate's own processes used
is what others took; `steal` is what the hypervisor gave to other guests. A round in which others
took more than `max_foreign` of the machine's capacity, or steal exceeded `max_steal`, is
disturbed: the gate measures it again. /proc/loadavg is recorded beside it for the report.
Where /proc is missing (not Linux), every round counts as quiet and the report says the guard was off.

A deliberate noisy neighbour (benchmarks/noisy_host.py) names its load processes in HARNESS_NOISY_HOST:
the guard counts their CPU with the gate's own, so the gate faces that load as it would a co-tenant
outside the machine, instead of measuring every round it touched again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import BadInputError

PROC = Path("/proc")
NOISE_ENV = "HARNESS_NOISY_HOST"  # comma-separated pids of a deliberate noisy neighbour's load
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuTimes:
    busy: float   # seconds, all CPUs: user + nice + system + irq + softirq
    steal: float
    total: float  # busy + idle + iowait + steal


@dataclass(frozen=True)
class Snapshot:
    cpu: CpuTimes | None
    own_cpu_s: float          # CPU seconds used so far by the gate's processes
    loadavg: float | None


def parse_stat(text: str) -> CpuTimes:
    """The aggregate `cpu` line of /proc/stat, in seconds."""
    fields = next(line for line in text.splitlines() if line.startswith("cpu ")).split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) / CLOCK_TICKS for v in (fields + ["0"] * 8)[:8])
    busy = user + nice + system + irq + softirq
    return CpuTimes(busy=busy, steal=steal, total=busy + idle + iowait + steal)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process and its waited-for children, in seconds (0 when it is gone)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def noise_pids(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The pids in HARNESS_NOISY_HOST; a BadInputError naming it when it holds anything else."""
    value = environ.get(NOISE_ENV, "")
    try:
        return tuple(int(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise BadInputError(f"{NOISE_ENV}={value!r}: give the noisy neighbour's process ids, separated by commas") from None


class LoadGuard:
    def __init__(self, *, max_foreign: float = 0.10, max_steal: float = 0.05, noise: tuple[int, ...] = (),
                 watch: bool = True):
        self.max_foreign, self.max_steal = max_foreign, max_steal
        self.enabled = watch and (PROC / "stat").exists()  # watch=False: nothing measured here (a replay)
        self.noise = noise  # a deliberate neighbour's pids (noise_pids): counted as the gate's own

    def snapshot(self, pids: Iterable[int]) -> Snapshot:
        if not self.enabled:
            return Snapshot(None, 0.0, None)
        cpu = parse_stat((PROC / "stat").read_text())
        own = sum(process_cpu_s(p) for p in {os.getpid(), *pids, *self.noise})
        try:
            load = float((PROC / "loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            load = None
        return Snapshot(cpu, own, load)

    def foreign(self, before: Snapshot, after: Snapshot) -> float:
        """The share of the machine that processes other than the gate's (and a named neighbour's) used."""
        total = after.cpu.total - before.cpu.total
        busy = after.cpu.busy - before.cpu.busy
        return max(0.0, busy - (after.own_cpu_s - before.own_cpu_s)) / total if total > 0 else 0.0

    def disturbance(self, before: Snapshot, after: Snapshot) -> str | None:
        """Why the round between the snapshots was disturbed, or None when it was quiet."""
        if before.cpu is None or after.cpu is None:
            return None
        total = after.cpu.total - before.cpu.total
        if total <= 0:
            return None
        foreign = self.foreign(before, after)
        steal = (after.cpu.steal - before.cpu.steal) / total
        if steal > self.max_steal:
            return f"steal {steal:.0%} of the machine"
        if foreign > self.max_foreign:
            return f"other processes used {foreign:.0%} of the machine (load {after.loadavg})"
        return None
