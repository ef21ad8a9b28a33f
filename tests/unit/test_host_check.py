"""Before the stored gate compares (harness/perf/stored/host.py): other software is named and still
compared; a host whose speed probe (harness/machine/hostspeed.py) is far from the stored one defers
to the A/B gate; a baseline without a probe says the host cannot be checked."""

from __future__ import annotations

import copy
import json

import pytest
from bench_scripts import BENCHMARKS, script_module

from harness.machine import hostspeed
from harness.perf.stored import host

pytestmark = pytest.mark.alone  # the host-speed probe, measured live and compared

FILE = "baselines/cpu-test-amx-2c.json"
SOFTWARE = {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.23.0", "harness": "0.1.0"}


@pytest.fixture(scope="module")
def probe():
    """This host's probe, measured for real once."""
    return hostspeed.measure()


def scaled(probe: dict, factor: float) -> dict:
    """The probe of a host `factor` times as fast as this one."""
    other = copy.deepcopy(probe)
    other["rates"] = {m: v * factor for m, v in probe["rates"].items()}
    return other


def record(host_probe: dict | None = None, **versions: str) -> dict:
    out = {"versions": {**SOFTWARE, **versions}}
    if host_probe is not None:
        out["host_probe"] = host_probe
    return out


def not_called():
    raise AssertionError("the probe was measured without a stored probe to compare with")


def test_the_probe_measures_every_rate_in_each_draw(probe):
    assert probe["version"] == hostspeed.VERSION and probe["repeats"] == hostspeed.REPEATS
    assert set(probe["rates"]) == set(hostspeed.NAMES) and all(v > 0 for v in probe["rates"].values())
    assert probe["draws"] == hostspeed.DRAWS == len(probe["draw_rates"]) > 1
    assert all(set(d) == set(hostspeed.NAMES) for d in probe["draw_rates"])


def test_a_dip_in_one_draw_does_not_move_the_probe(monkeypatch):
    # on the AMD EPYC VM a draw dipped for about a second (op dispatch down 45%), the next one not
    steady = {"memory_gbs": 20.0, "gemv_bf16_gbs": 11.0, "dispatch_kops": 400.0}
    dipped = {"memory_gbs": 19.0, "gemv_bf16_gbs": 8.8, "dispatch_kops": 220.0}
    draws = iter([dipped, steady, {m: v * 1.01 for m, v in steady.items()}])
    monkeypatch.setattr(hostspeed._Kernels, "__init__", lambda self: None)
    monkeypatch.setattr(hostspeed._Kernels, "draw", lambda self, repeats: next(draws))
    measured = hostspeed.measure()
    assert measured["rates"] == {"memory_gbs": 20.0, "gemv_bf16_gbs": 11.0, "dispatch_kops": 400.0}
    stored = {"version": hostspeed.VERSION, "rates": steady}
    assert hostspeed.compare(stored, measured).comparable
    assert not hostspeed.compare(stored, {**measured, "rates": dipped}).comparable  # that draw alone defers
    assert measured["draw_rates"][0] == dipped


def test_a_host_far_from_the_baselines_host_defers_to_the_ab_gate(probe):
    # the stored probe: a host twice as fast as this one; this host's probe is measured for real
    checked = host.check(record(scaled(probe, 2.0)), FILE, SOFTWARE, hostspeed.measure)
    assert checked.deferred is not None
    assert checked.deferred.startswith("this host's probe is ") and "% slower" in checked.deferred
    assert f"than the host that measured {FILE}" in checked.deferred
    assert checked.deferred.endswith("not comparable: the stored gate defers to the A/B gate (`make perf-ab`)")
    assert checked.comparison["comparable"] is False and checked.notes == []
    faster = host.check(record(scaled(probe, 0.5)), FILE, SOFTWARE, lambda: probe)
    assert "100% faster" in faster.deferred


@pytest.mark.parametrize("direction", [1, -1])
def test_the_threshold_is_where_the_probe_stops_being_comparable(probe, direction):
    inside = 1 + direction * hostspeed.THRESHOLD * 0.9
    outside = 1 + direction * hostspeed.THRESHOLD * 1.1
    assert host.check(record(scaled(probe, 1 / inside)), FILE, SOFTWARE, lambda: probe).deferred is None
    assert host.check(record(scaled(probe, 1 / outside)), FILE, SOFTWARE, lambda: probe).deferred is not None
    # one rate off is enough: each says something else about the host
    one = copy.deepcopy(probe)
    one["rates"]["dispatch_kops"] /= outside
    assert host.check(record(one), FILE, SOFTWARE, lambda: probe).deferred is not None


def test_other_software_is_named_and_still_compared(probe):
    checked = host.check(record(probe, torch="2.14.0"), FILE, SOFTWARE, lambda: probe)
    assert checked.notes == [f"software changed since {FILE} was measured: torch 2.14.0 -> 2.13.0 (compared anyway)"]
    assert checked.deferred is None and checked.comparison["comparable"] is True


def test_a_baseline_without_a_probe_cannot_check_the_host_and_says_how(probe):
    checked = host.check(record(), FILE, SOFTWARE, not_called)
    assert checked.deferred is None
    assert checked.notes == [f"{FILE} records no host-speed probe (measured before probes existed): whether this "
                             "host is as fast as the one that measured it cannot be checked; record one with "
                             "`pytest -m perf --perf-update-baselines`"]
    older = dict(probe, version=hostspeed.VERSION + 1)
    assert "cannot be checked" in host.check(record(older), FILE, SOFTWARE, lambda: probe).notes[0]
    assert host.check(record(probe), FILE, SOFTWARE, None).notes == []  # a GPU platform: no CPU probe


def test_the_spread_report_compares_the_median_of_draws_with_one_draw():
    """benchmarks/hostspeed_spread.py on the committed probes of three draws (the AMD EPYC VM): the
    same processes' first draws alone defer pairs that the medians do not."""
    data = BENCHMARKS / "data" / "hostspeed_avx512-bf16_threads_one_draws3_2026-12-07.json"
    probes = json.loads(data.read_text())
    with script_module("hostspeed_spread") as spread:
        lines = spread.report_lines(probes, [hostspeed.THRESHOLD])
    assert lines[1] == f"each rate the median of {hostspeed.DRAWS} draw(s):"
    assert lines[5] == "threshold  25%: 0/1560 pairs (0.0%) not comparable"
    assert lines[6] == "each probe's first draw alone (a probe of one draw):"
    assert lines[-1] == "threshold  25%: 152/1560 pairs (9.7%) not comparable"
