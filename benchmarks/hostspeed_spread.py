"""The host-speed probe's own spread on this host: N probes, each in a fresh process (as an update
and a later gate are), and how often two of them would call the same host not comparable.

    python benchmarks/hostspeed_spread.py --runs 30 [--threads one|all] [--json results/hostspeed_spread.json]

--threads: the probe as the stored gate measures it (harness/perf/stored/placement.py): one thread
pinned to one core (one, the gate's default) or torch's threads on every core (all).

Prints, per rate: the median, the spread between processes (sd of the log, the range around the
median), then, for a few thresholds, the share of ordered pairs of runs (one as the stored probe,
one as this host's) that harness/machine/hostspeed.py compare() would call not comparable. The figures
behind hostspeed.THRESHOLD came from this script. Where the probes kept their draws
(hostspeed.DRAWS), the same is printed for each probe's first draw alone, as a probe of one draw
would have read in the same processes: what taking the median of several draws changes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.machine import hostspeed  # noqa: E402
from harness.perf.stored import placement  # noqa: E402

PROBE = """import json, sys
from harness.machine import hostspeed
from harness.perf.stored import placement
with placement.resolve(sys.argv[1]).applied():
    probe = hostspeed.measure()
print(json.dumps(probe))
"""


def run_probes(runs: int, threads: str) -> list[dict]:
    probes = []
    for i in range(runs):
        out = subprocess.run([sys.executable, "-c", PROBE, threads], capture_output=True, text=True, cwd=REPO,
                             check=True)
        probes.append(json.loads(out.stdout))
        print(f"run {i + 1}/{runs}: {probes[-1]['rates']} ({probes[-1]['seconds']:.2f} s)", file=sys.stderr)
    return probes


def spread_lines(probes: list[dict]) -> list[str]:
    lines = []
    for rate in hostspeed.NAMES:
        values = [p["rates"][rate] for p in probes]
        mid = statistics.median(values)
        sd = statistics.stdev(math.log(v) for v in values)
        lines.append(f"{rate:14s} median {mid:8.3g} {hostspeed.UNITS[rate]:5s} sd(log) {sd * 100:4.1f}%  "
                     f"range {(min(values) / mid - 1) * 100:+5.1f}% .. {(max(values) / mid - 1) * 100:+5.1f}%")
    return lines


def deferral_lines(probes: list[dict], thresholds: list[float]) -> list[str]:
    pairs = list(itertools.permutations(probes, 2))
    lines = []
    for t in thresholds:
        deferred = sum(not hostspeed.compare(stored, here, t).comparable for stored, here in pairs)
        lines.append(f"threshold {t:4.0%}: {deferred}/{len(pairs)} pairs ({deferred / len(pairs):.1%}) not comparable")
    return lines


def first_draws(probes: list[dict]) -> list[dict]:
    """Each probe as one draw would have measured it: its first draw's rates."""
    return [{**p, "rates": p["draw_rates"][0]} for p in probes if p.get("draw_rates")]


def report_lines(probes: list[dict], thresholds: list[float]) -> list[str]:
    draws = probes[0].get("draws", 1)
    lines = [f"{len(probes)} probes, {statistics.median(p['seconds'] for p in probes):.2f} s each (median)",
             f"each rate the median of {draws} draw(s):", *spread_lines(probes), *deferral_lines(probes, thresholds)]
    single = first_draws(probes)
    if draws > 1 and len(single) == len(probes):
        lines += ["each probe's first draw alone (a probe of one draw):", *spread_lines(single),
                  *deferral_lines(single, thresholds)]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", choices=placement.CHOICES, default=placement.ONE,
                   help="the stored gate's --perf-threads: one pinned thread (default) or every core")
    p.add_argument("--json", type=Path, help="save the probes")
    p.add_argument("--from-json", type=Path, help="read saved probes instead of measuring")
    args = p.parse_args(argv)
    probes = json.loads(args.from_json.read_text()) if args.from_json else run_probes(args.runs, args.threads)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(probes, indent=1) + "\n")
    for line in report_lines(probes, [0.10, 0.15, 0.20, 0.25, 0.30, hostspeed.THRESHOLD]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
