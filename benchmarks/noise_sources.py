"""Where a gate's round-to-round noise comes from, from the rows ab_power.py kept.

For each A/A gate of a JSON-lines file (benchmarks/data/ab_power_*.jsonl), per metric:
- the per-round sd of ln(candidate / base) of the wall time and of the CPU time the arms used: if
  CPU time is much steadier, the arms were descheduled (time slices taken), else they ran slower;
- the arms' CPU time as a share of their wall time;
- the lag-1 autocorrelation of ln(arm on the first core / arm on the second) and of
  ln(candidate / base): the arms swap cores every round, so a slow core makes the first alternate
  (negative autocorrelation of the ratio) and a slow process makes the second persist.
Then, over the file's A/A gates, two ways a gate might see through that noise:
- a core term in the paired model: the mean per-gate sd of ln(candidate / base) of each tokens/s
  metric as the gate has it, and with each round's core (the candidate's) fitted as an offset;
- assisted tokens/s predicted from each round's phase medians (draft steps, verifications and host
  overhead, calls x median) instead of measured: the per-round spread of each, all rounds pooled;
and what the worker restarts are for: the spread between worker pairs (blocks of `restart_every`
rounds) beside the spread within one, by a one-way analysis of variance; and the spread of each
place in a worker pair (its first round, its second, ...), which shows what a start leaves in the
rounds after it (docs/gate-studies.md, "The first round of a worker"); and, over every gate of the file by
the candidate's commit, how often an arm's round at each place held a one-off spike of host work,
and, where the rows kept them, how often it took over 100 page faults (touched memory anew).

    python benchmarks/noise_sources.py benchmarks/data/ab_power_avx512-bf16_duet_vm-busy.jsonl
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.measure.phases import DRAFT_STEP, OVERHEAD, OVERHEAD_CPU, VERIFY
from harness.perf.ab.gate import ABSettings

ASSISTED_PHASES = (DRAFT_STEP, VERIFY, OVERHEAD)  # an assisted decode step's passes and host work


def lag1(x: list[float]) -> float:
    m = statistics.fmean(x)
    v = sum((a - m) ** 2 for a in x)
    return sum((x[i] - m) * (x[i + 1] - m) for i in range(len(x) - 1)) / v if v else 0.0


def describe(gate: dict) -> str:
    wb, wc = gate["wall_s"]["base"], gate["wall_s"]["candidate"]
    cb, cc = gate["cpu_s"]["base"], gate["cpu_s"]["candidate"]
    wall = [math.log(c / b) for b, c in zip(wb, wc)]
    cpu = [math.log(c / b) for b, c in zip(cb, cc)]
    share = statistics.fmean(c / w for c, w in zip(cb + cc, wb + wc))
    first = gate["cores"]["base"][0]
    plain_b, plain_c = gate["arms"]["base"]["plain_tokens_per_sec"], gate["arms"]["candidate"]["plain_tokens_per_sec"]
    cores = [math.log(b / c) if core == first else math.log(c / b)
             for b, c, core in zip(plain_b, plain_c, gate["cores"]["base"])]
    ratio = [math.log(c / b) for b, c in zip(plain_b, plain_c)]
    return (f"{gate['condition']:>14} {gate['outcome']:>10} {len(wall):>3} rounds: round time sd wall {statistics.stdev(wall):.1%}"
            f", CPU {statistics.stdev(cpu):.1%}; CPU share {share:.2f}; plain lag-1: core/core {lag1(cores):+.2f},"
            f" candidate/base {lag1(ratio):+.2f}")


def restart_every(gate: dict) -> int:
    """Rounds per worker pair in a kept gate (its own setting; the gate's default where a row predates it)."""
    return gate.get("restart_every", ABSettings().restart_every)


def core_term_sd(d: list[float], candidate_cores: list[int]) -> float:
    """The residual sd of d after fitting a mean and an offset for the candidate's core (n - 2 df)."""
    s = [1.0 if c == candidate_cores[0] else -1.0 for c in candidate_cores]
    ms, md = statistics.fmean(s), statistics.fmean(d)
    sxx = sum((x - ms) ** 2 for x in s)
    slope = sum((x - ms) * (y - md) for x, y in zip(s, d)) / sxx if sxx else 0.0
    residuals = [y - md - slope * (x - ms) for x, y in zip(s, d)]
    return math.sqrt(sum(r * r for r in residuals) / (len(d) - 2))


def assisted_from_phases(rounds: dict | None) -> float | None:
    """An arm's assisted decode time in a round predicted from its phase medians, in ms."""
    if not rounds or any(p not in rounds for p in ASSISTED_PHASES):
        return None
    return sum(rounds[p]["calls"] * rounds[p]["median_ms"] for p in ASSISTED_PHASES)


def pair_spread(gates: list[dict], metric: str) -> tuple[float, float]:
    """(within, between): the sd of a metric's ln(candidate / base) among one worker pair's rounds,
    and the sd of the pairs' own offsets (the excess of the block means' variance over what the
    within-pair spread explains; 0 when there is none)."""
    within, means, sizes = [], [], []
    for g in gates:
        d, every = [math.log(r) for r in g["ratios"][metric]], restart_every(g)
        for block in (d[i:i + every] for i in range(0, len(d) - every + 1, every)):
            within.append(statistics.variance(block))
            means.append(statistics.fmean(block))
            sizes.append(len(block))
    w = statistics.fmean(within)
    return math.sqrt(w), math.sqrt(max(0.0, statistics.variance(means) - w / statistics.fmean(sizes)))


def place_spread(gates: list[dict], metric: str) -> list[float]:
    """The sd of a metric's ln(candidate / base) over the rounds at each place in a worker pair
    (index 0: the first round after a start), all gates pooled."""
    places: dict[int, list[float]] = {}
    for g in gates:
        every = restart_every(g)
        for i, r in enumerate(g["ratios"][metric]):
            places.setdefault(i % every, []).append(math.log(r))
    return [statistics.stdev(places[i]) for i in sorted(places) if len(places[i]) > 1]


FAULTS_NOTED = 100  # page faults in a round: its own work touches a few pages anew, a heap that grew a thousand and more
PAGE_FAULTS = "page_faults"  # Round's field (harness/perf/record.py), which ab_power.py's rows and worker_start.py's keep by arm
SPIKE_MS = 25.0  # a round's host work this far above the arm's median round: a one-off cost, not noise (a step's is ~20 ms)


@dataclass(frozen=True)
class Spikes:
    """One commit's one-off spikes of host work (host_spikes())."""
    spike_ms: float                       # the cut-off: a round this far above its arm's median round
    places: tuple[tuple[int, int], ...]  # by place in a worker pair: (arm rounds that spiked, arm rounds)
    sizes_ms: tuple[float, ...]          # how far above its arm's median round each spike stood
    # by place: (arm rounds whose generating thread took over FAULTS_NOTED page faults, arm rounds that
    # counted them); empty where no row kept the counts (rows before the rounds counted page faults)
    faulted: tuple[tuple[int, int], ...] = ()
    spikes_faulted: int = 0              # spikes in a round that took over FAULTS_NOTED page faults
    spikes_counted: int = 0              # spikes in a round that counted its page faults


def host_spikes(gates: list[dict], spike_ms: float = SPIKE_MS) -> dict[str, Spikes]:
    """By the candidate's commit: at each place in a worker pair, how many arm rounds' host work
    (`overhead_cpu`'s total) stood more than `spike_ms` above that arm's median round in its gate,
    of how many. Every gate of a file counts, planted or not: a spike is judged against the arm's
    own rounds. Arms without the phase in every round, and rows without a commit, are left out. A
    round the load guard redid ran again in the same worker, so its place counts one run later."""
    # per commit: spiked and counted by place, the spikes' sizes, faulted and counted by place, spikes faulted and counted
    acc: dict[str, tuple[dict[int, list[int]], list[float], dict[int, list[int]], list[int]]] = {}
    for g in gates:
        commit = ((g.get("trees") or {}).get("candidate") or {}).get("commit")
        arms = g.get("phases") or {}
        if not commit or not arms:
            continue
        every = restart_every(g)
        by_place, found, faulted, among = acc.setdefault(commit[:7], ({}, [], {}, [0, 0]))
        for arm, rounds in arms.items():
            totals = [((r or {}).get(OVERHEAD_CPU) or {}).get("total_ms") for r in rounds]
            if None in totals or len(totals) < 3:  # a median of two would halve a spike
                continue
            faults = (g.get(PAGE_FAULTS) or {}).get(arm) or []
            faults = faults if len(faults) == len(totals) and None not in faults else None
            median = statistics.median(totals)
            for i, total in enumerate(totals):
                cell = by_place.setdefault(i % every, [0, 0])
                cell[1] += 1
                touched = faults is not None and faults[i] > FAULTS_NOTED
                if faults is not None:
                    fault_cell = faulted.setdefault(i % every, [0, 0])
                    fault_cell[0] += touched
                    fault_cell[1] += 1
                if total - median > spike_ms:
                    cell[0] += 1
                    found.append(total - median)
                    among[0] += touched
                    among[1] += faults is not None
    return {c: Spikes(spike_ms, tuple(tuple(by_place[i]) for i in sorted(by_place)), tuple(found),
                      tuple(tuple(faulted[i]) for i in sorted(faulted)), among[0], among[1])
            for c, (by_place, found, faulted, among) in acc.items() if by_place}


def spikes_line(commit: str, spikes: Spikes) -> str:
    line = (f"host-work spikes (overhead_cpu over {spikes.spike_ms:.0f} ms above the arm's median round) by place in a worker "
            f"pair, every gate with candidate {commit}: " + ", ".join(f"{k}/{n}" for k, n in spikes.places))
    if spikes.sizes_ms:
        q = statistics.quantiles(spikes.sizes_ms, n=10, method="inclusive") if len(spikes.sizes_ms) > 1 else spikes.sizes_ms * 9
        line += (f"; above the median round by {statistics.median(spikes.sizes_ms):.0f} ms "
                 f"(10th-90th percentile {q[0]:.0f}-{q[-1]:.0f}, all {min(spikes.sizes_ms):.0f}-{max(spikes.sizes_ms):.0f})")
    if spikes.faulted:
        line += (f"; rounds with over {FAULTS_NOTED} page faults by place: " + ", ".join(f"{k}/{n}" for k, n in spikes.faulted)
                 + f", {spikes.spikes_faulted} of the {spikes.spikes_counted} spikes whose rounds counted page faults were among them")
    return line


def rms(x: list[float]) -> float:
    return math.sqrt(sum(v * v for v in x) / len(x))


def summary(gates: list[dict]) -> list[str]:
    """Over a file's A/A gates: the core-term line, the worker-pair line and the line by place in a
    worker pair (gates side by side), then the phase-prediction line (rounds that kept their phases)."""
    lines = []
    paired = [g for g in gates if g.get("cores") and len(g["ratios"]["speedup"]) > 2]
    if paired:
        cells = []
        for m in ("speedup", "assisted_tokens_per_sec", "plain_tokens_per_sec"):
            d = [[math.log(r) for r in g["ratios"][m]] for g in paired]
            now = statistics.fmean(statistics.stdev(x) for x in d)
            fitted = statistics.fmean(core_term_sd(x, g["cores"]["candidate"]) for x, g in zip(d, paired))
            cells.append(f"{m} {now:.2%} -> {fitted:.2%}")
        lines.append(f"{len(paired)} A/A gates, mean per-gate sd of ln(candidate/base), as gated -> with a core term: "
                     + ", ".join(cells))
        spreads = {m: pair_spread(paired, m) for m in ("assisted_tokens_per_sec", "plain_tokens_per_sec", "speedup")}
        lines.append("spread of ln(candidate/base) between worker pairs and within one: "
                     + ", ".join(f"{m} {between:.2%} between, {within:.2%} within"
                                 for m, (within, between) in spreads.items()))
        lines.append("spread of ln(candidate/base) by place in a worker pair (first round, second, ...): "
                     + ", ".join(f"{m} " + " ".join(f"{sd:.2%}" for sd in place_spread(paired, m))
                                 for m in ("assisted_tokens_per_sec", "plain_tokens_per_sec", "speedup", OVERHEAD_CPU, OVERHEAD)
                                 if all(m in g["ratios"] for g in paired)))
    measured, predicted = [], []
    for g in gates:
        for i, (b, c) in enumerate(zip(*(g.get("phases", {}).get(arm) or [] for arm in ("base", "candidate")))):
            pb, pc = assisted_from_phases(b), assisted_from_phases(c)
            if pb and pc:
                measured.append(math.log(g["ratios"]["assisted_tokens_per_sec"][i]))
                predicted.append(math.log(pb / pc))
    if measured:
        lines.append(f"{len(measured)} A/A rounds with phases, per-round spread of assisted tokens/s: measured "
                     f"{rms(measured):.2%}, predicted from the phase medians {rms(predicted):.2%}")
    return lines


def main(paths: list[str]) -> int:
    for path in paths:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        gates = [gate for gate in rows if gate["level"] == 0 and gate.get("into") != "env"]
        print(path)
        for gate in gates:
            if "cpu_s" in gate and gate.get("cores"):
                print(describe(gate))
        for line in summary(gates):
            print("  " + line)
        for commit, spikes in host_spikes(rows).items():
            print("  " + spikes_line(commit, spikes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
