"""Before the stored-baseline gate compares: was the baseline measured with this software, and on
a host as fast as this one?

- Other software versions: the baseline is still used, with one line naming what changed
  (`torch 2.13.0 -> 2.14.0`).
- The host-speed probe (harness/machine/hostspeed.py): this host's probe against the one recorded
  with the baseline. Beyond hostspeed.THRESHOLD the hosts are not comparable, and the stored gate
  defers to the A/B gate: the combination's outcome is DEFERRED, neither a pass nor a fail.
- A baseline without a probe (measured before probes existed) is compared, with a note that the
  host cannot be checked and how to record a probe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.machine import hostspeed
from harness.perf.stored.baselines import UPDATE_COMMAND, software_changes

AB_COMMAND = "make perf-ab"


@dataclass
class HostCheck:
    notes: list[str] = field(default_factory=list)  # recorded and printed; the comparison goes on
    deferred: str | None = None  # the line when the stored gate defers to the A/B gate
    comparison: dict[str, Any] | None = None  # the probe's ratios, for results.json


def check(record: Mapping[str, Any], baseline_file: str, software_here: Mapping[str, str],
          probe_here: Callable[[], dict[str, Any]] | None, threshold: float = hostspeed.THRESHOLD) -> HostCheck:
    """The check of one stored combination. `probe_here` measures this host's probe (called only
    when the record has a probe to compare with); None where the probe does not apply (a GPU).
    `threshold`: --perf-host-threshold."""
    out = HostCheck()
    changed = software_changes(record["versions"], software_here)
    if changed:
        out.notes.append(f"software changed since {baseline_file} was measured: {', '.join(changed)} "
                         "(compared anyway)")
    if probe_here is None:
        return out
    stored = record.get("host_probe")
    if stored is None:
        out.notes.append(f"{baseline_file} records no host-speed probe (measured before probes existed): whether "
                         f"this host is as fast as the one that measured it cannot be checked; record one with "
                         f"`{UPDATE_COMMAND}`")
        return out
    here = probe_here()
    host = hostspeed.compare(stored, here, threshold)
    if host is None:
        out.notes.append(f"{baseline_file} records a host-speed probe of version {stored.get('version')} (this "
                         f"harness measures version {here['version']}): the host cannot be checked; record a new "
                         f"one with `{UPDATE_COMMAND}`")
        return out
    out.comparison = {"ratios": {m: round(r, 4) for m, r in host.ratios.items()}, "threshold": host.threshold,
                      "comparable": host.comparable, "headline": host.headline(), "probe": here}
    if not host.comparable:
        out.deferred = (f"this host's probe is {host.headline()} than the host that measured {baseline_file} "
                        f"({host.describe(stored, here)}; threshold {host.threshold:.0%}): not comparable: the "
                        f"stored gate defers to the A/B gate (`{AB_COMMAND}`)")
    return out
