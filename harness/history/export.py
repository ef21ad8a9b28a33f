"""The history in other tools' formats, so a team can feed its own dashboard:

- Apache Otava: one CSV per series (time, commit, dirty, kind and the metric's column) and an
  otava.yaml naming each as a `csv` test with the metric's direction (-1 where lower is better), as
  Otava's CSV importer reads them (`otava analyze <test>` from that folder);
- Bencher: one Bencher Metric Format (BMF) JSON per run ({combination: {metric: {value, lower_value,
  upper_value}}}) and an index.json of the runs (file, commit, date, testbed = platform id, kind), to
  post each with `bencher run --adapter json --file FILE --hash COMMIT --testbed PLATFORM`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core import jsonio
from harness.history.changes import LOWER_IS_BETTER_SUFFIXES
from harness.history import series as hseries
from harness.history.store import Point, StoredRun


@dataclass(frozen=True)
class Written:
    folder: Path
    files: int          # data files, the index or config beside them not counted
    rows: int           # points (Otava) or measurements (Bencher)


def direction(metric: str) -> int:
    """Otava's direction: 1 where higher is better, -1 for times."""
    return -1 if metric.endswith(LOWER_IS_BETTER_SUFFIXES) else 1


def _otava_csv(metric: str, points: Sequence[Point]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["time", "commit", "dirty", "kind", metric])
    for p in points:
        w.writerow([p.date, p.commit or "", "" if p.dirty is None else str(p.dirty).lower(), p.kind,
                    repr(float(p.measurement.median))])
    return out.getvalue()


def otava(series: dict[tuple[str, str, str], list[Point]], folder: Path) -> Written:
    """One CSV per series and the otava.yaml that names them (JSON strings are YAML scalars)."""
    folder.mkdir(parents=True, exist_ok=True)
    tests, rows = [], 0
    for (combination, metric, platform_id), points in sorted(series.items()):
        slug = hseries.slug((combination, metric, platform_id))
        jsonio.atomic_write_text(folder / f"{slug}.csv", _otava_csv(metric, points))
        rows += len(points)
        tests += [f"  {json.dumps(slug)}:", "    type: csv", f"    file: {json.dumps(slug + '.csv')}",
                  "    time_column: time", "    attributes: [commit, dirty, kind]", "    metrics:",
                  f"      {json.dumps(metric)}:", f"        direction: {direction(metric)}"]
    header = ["# Apache Otava tests, one per series of the assisted-generation run history:",
              "#   cd THIS_FOLDER && otava analyze --config-file otava.yaml TEST", "tests:"]
    jsonio.atomic_write_text(folder / "otava.yaml", "\n".join(header + tests) + "\n")
    return Written(folder, len(series), rows)


def bmf(run: StoredRun, keep: set[tuple[str, str, str]] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """A run's measurements in Bencher Metric Format; `keep` filters (combination, metric, platform)."""
    doc: dict[str, dict[str, dict[str, float]]] = {}
    for m in run.run.measurements:
        if keep is not None and (m.combination, m.metric, run.run.provenance.platform_id) not in keep:
            continue
        value = {"value": float(m.median)}
        if m.low is not None and m.high is not None:
            value |= {"lower_value": float(m.low), "upper_value": float(m.high)}
        doc.setdefault(m.combination, {})[m.metric] = value
    return doc


def bencher(runs: Sequence[StoredRun], folder: Path, keep: set[tuple[str, str, str]] | None = None) -> Written:
    """One BMF file per run (oldest first, numbered) and index.json listing them."""
    folder.mkdir(parents=True, exist_ok=True)
    index, rows = [], 0
    for i, stored in enumerate(runs, 1):
        doc = bmf(stored, keep)
        if not doc:
            continue
        p = stored.run.provenance
        name = f"{i:05d}-{(p.commit or 'nocommit')[:12]}.json"
        jsonio.atomic_write_text(folder / name, json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        rows += sum(len(v) for v in doc.values())
        index.append({"file": name, "commit": p.commit, "dirty": p.dirty, "date": p.date, "testbed": p.platform_id,
                      "kind": stored.run.kind, "label": stored.run.label, "key": stored.key})
    jsonio.atomic_write_text(folder / "index.json", json.dumps(index, indent=1) + "\n")
    return Written(folder, len(index), rows)
