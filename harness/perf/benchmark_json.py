"""The gate's rounds in pytest-benchmark's JSON (`--benchmark-json PATH`).

pytest-benchmark times what runs through its `benchmark` fixture: the stored-baseline gate's rounds
do, the A/B gate's run in worker processes and do not. Both gates' rounds go into the file here, one
entry per combination and arm, in pytest-benchmark's own format (stats over the rounds' wall
times, every round's data, and the gate's verdict and per-round metrics in `extra_info`), so tools
that read that format (pytest-benchmark compare, CI dashboards) see them:

- benchmarks enabled: the A/B gate's entries are added to the file pytest-benchmark writes
  (`pytest_benchmark_update_json`);
- `--benchmark-disable` (the make targets): pytest-benchmark writes no file at all, so the whole
  file is written here, after the session, with both gates' entries.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
from pathlib import Path
from typing import Any

from harness.core import jsonio
from harness.perf.record import CombinationResult, Round

log = logging.getLogger(__name__)

GROUP = "perf gate"


def _stats(rounds: list[Round]) -> dict[str, Any] | None:
    from pytest_benchmark.stats import Stats

    walls = [r.wall_s for r in rounds if r.wall_s is not None]
    if not walls:
        return None
    stats = Stats()
    for wall in walls:
        stats.update(wall)
    return {**stats.as_dict(), "data": walls}


def _entry(result: CombinationResult, arm: str, rounds: list[Round], nodeid: str | None) -> dict[str, Any] | None:
    stats = _stats(rounds)
    if stats is None:
        return None
    name = f"test_perf[{result.combination}]" + ("" if arm == "this tree" else f" ({arm})")
    return {
        "group": GROUP, "name": name, "fullname": (nodeid or name) + ("" if arm == "this tree" else f"::{arm}"),
        "params": {"perf_combination": result.combination}, "param": result.combination,
        "extra_info": {"combination": result.combination, "gate": result.gate, "arm": arm,
                       "verdict": result.verdict.value,
                       "rounds": [{k: v for k, v in dataclasses.asdict(r).items() if k != "counters"} for r in rounds]},
        "options": {"timer": "time.perf_counter", "rounds": len(rounds), "iterations": 1, "unit": "round"},
        "stats": stats,
    }


def entries(results: list[CombinationResult], nodeids: dict[str, str], *, ab_only: bool = False) -> list[dict[str, Any]]:
    """One entry per combination and arm: the stored gate's rounds (unless ab_only: pytest-benchmark
    has them), the A/B gate's base and candidate rounds."""
    out = []
    for result in results:
        if result.ab is not None:
            arms = [(f"base {result.ab.base}", result.ab.base_rounds), (f"candidate {result.ab.candidate}", result.rounds)]
        elif not ab_only:
            arms = [("this tree", result.rounds)]
        else:
            arms = []
        out += [e for arm, rounds in arms if (e := _entry(result, arm, rounds, nodeids.get(result.combination)))]
    return out


def write(path: Path, results: list[CombinationResult], nodeids: dict[str, str], config: Any) -> None:
    """The whole file, as pytest-benchmark would write it, for a run with benchmarks disabled."""
    hook = config.hook
    doc = {"machine_info": hook.pytest_benchmark_generate_machine_info(config=config),
           "commit_info": hook.pytest_benchmark_generate_commit_info(config=config),
           "benchmarks": entries(results, nodeids), "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(),
           "version": _version()}
    jsonio.atomic_write_text(Path(path), json.dumps(doc, indent=4, default=str) + "\n")
    log.info("wrote the gate's rounds (%d entries) to %s", len(doc["benchmarks"]), path)


def _version() -> str:
    import pytest_benchmark

    return pytest_benchmark.__version__
