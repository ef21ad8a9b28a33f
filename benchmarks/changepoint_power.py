"""How well does `history changes` (harness/history/changes.py) find a step, how often does it find
one that is not there, and how fast is it over a large history?

Detection, with the detector's default settings on seeds 0..N-1 (the scored figures). Other
settings (--test, --window, --max-pvalue) are refused there: they are explored on held-out seeds
only, --seed-offset 100000 or above, so that nothing is tuned on the scored series.

  * step: 30 points at level 1, then 30 at 0.95 (a 5% slowdown), each point level x (1 + noise);
    found when a change point lies within 2 points of the step (index 30);
  * flat: 200 points at level 1, the same noise; every change point is a false one;
  * A/A, flat and step: 200 history points resampled from the recorded A/A gates in
    benchmarks/data/ab_power_avx512-bf16_duet_*.jsonl (rows with level 0.0), one arm and metric at
    a time, then the same series with points 100.. multiplied by 0.95.

Noise models (fixed before any run): gaussian: e ~ N(0, 1) x 2% (sd 2%); t3-scale: e ~ Student-t
with 3 degrees of freedom x 2% (scale 2%, sd 3.46%); t3-sd: the same t divided by sqrt(3) (sd 2%).

A history point is the median of one run's rounds (the store keeps per-run medians), and rounds
within one gate's worker pair are correlated, so the A/A points keep each gate whole: a unit is one
arm of one A/A gate (both arms run the same code); gate-median: a point is a random unit's median
as recorded; resampled-rounds: a random unit's rounds drawn again with replacement (as many as it
had), then their median (a two-stage bootstrap: between-gate spread kept, within-gate added).

Timing: a history of 100 series x 1,000 points (100,000 measurements) is built with the store's
append (5 platforms x 1,000 bench runs of 20 measurements), then `python -m harness history changes`
runs on it (wall time, interpreter start included), reading and detecting are timed in process, and
50 appends of a gate run (3 metrics x 1-4 combinations) are timed into a copy of it; each --timing-runs
times, the medians reported.

    python benchmarks/changepoint_power.py                      # ~2 minutes; writes the data file
    python benchmarks/changepoint_power.py --from-json benchmarks/data/changepoint_power.json
    python benchmarks/changepoint_power.py --seed-offset 100000 --test welch --window 30 --timing-runs 0 --out /tmp/w.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.core import jsonio, progress
from harness.history import changes, store
from harness.machine import capability
from harness.history.store import Measurement, Run
from harness.machine.provenance import Provenance

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"
AB_ROWS = sorted(DATA.glob("ab_power_avx512-bf16_duet_*.jsonl"))
DEFAULT_OUT = DATA / "changepoint_power.json"

SPREAD, STEP, SIDE, FLAT, PLANT_AT, REACH = 0.02, -0.05, 30, 200, 100, 2
NOISES = {
    "gaussian": "N(0, 1) x 2%: sd 2%",
    "t3-scale": "Student-t(3) x 2%: scale 2%, sd 3.46%",
    "t3-sd": "Student-t(3) / sqrt(3) x 2%: sd 2%",
}
AB_METRICS = ("plain_tokens_per_sec", "assisted_tokens_per_sec", "speedup")
AB_POINTS = {
    "gate-median": "the median of a random A/A gate arm's rounds",
    "resampled-rounds": "the median of a random A/A gate arm's rounds resampled with replacement",
}
TARGET_FOUND, TARGET_FALSE = 0.95, 1.0
HELD_OUT = 100_000  # seeds from here on are for exploring settings; 0.. are the scored ones


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=1000, help="seeded series per case (default 1000)")
    p.add_argument("--seed-offset", type=int, default=0,
                   help=f"first seed (default 0: the scored seeds; explore or tune only at {HELD_OUT} and above)")
    p.add_argument("--test", choices=changes.TESTS, default=changes.TEST,
                   help=f"the detector's two-sample test (default {changes.TEST}); another only with held-out seeds")
    p.add_argument("--window", type=int, default=changes.WINDOW,
                   help=f"the detector's window (default {changes.WINDOW}); another only with held-out seeds")
    p.add_argument("--max-pvalue", type=float, default=changes.MAX_PVALUE,
                   help=f"the detector's max p-value (default {changes.MAX_PVALUE}); another only with held-out seeds")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the results as JSON (default {DEFAULT_OUT})")
    p.add_argument("--from-json", type=Path, metavar="PATH", help="print the tables of a saved run; measure nothing")
    p.add_argument("--timing-runs", type=int, default=3, help="times the timing part runs (median reported; 0: skip)")
    p.add_argument("--appends", type=int, default=50, help="gate runs appended per timing run")
    p.add_argument("--work-dir", type=Path, default=None, help="where the large history is built (default: a temp dir)")
    return p.parse_args(argv)


# -- series ---------------------------------------------------------------------------------------

def noise(model: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if model == "gaussian":
        return rng.standard_normal(n)
    t = rng.standard_t(3, n)
    return t if model == "t3-scale" else t / np.sqrt(3.0)


def synthetic(model: str, seed: int, flat: bool) -> np.ndarray:
    """One series: FLAT points at level 1, or SIDE at 1 then SIDE at 1 + STEP; noise relative to the level."""
    rng = np.random.default_rng(seed)
    levels = np.ones(FLAT) if flat else np.r_[np.ones(SIDE), np.full(SIDE, 1.0 + STEP)]
    return levels * (1.0 + SPREAD * noise(model, rng, len(levels)))


def aa_units(metric: str) -> list[np.ndarray]:
    """Per-round values of one metric, one array per arm of every recorded A/A gate."""
    units = []
    for path in AB_ROWS:
        for row in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
            if row["level"] == 0.0:
                units += [np.asarray(row["arms"][arm][metric], dtype=float) for arm in ("base", "candidate")]
    return units


def resampled(units: list[np.ndarray], how: str, seed: int, step: bool) -> np.ndarray:
    """FLAT history points, each from one random unit (see AB_POINTS); points PLANT_AT.. x (1 + STEP)."""
    rng = np.random.default_rng(seed)
    points = np.empty(FLAT)
    for i, u in enumerate(rng.integers(len(units), size=FLAT)):
        rounds = units[u] if how == "gate-median" else rng.choice(units[u], size=len(units[u]))
        points[i] = np.median(rounds)
    if step:
        points[PLANT_AT:] *= 1.0 + STEP
    return points


# -- scoring --------------------------------------------------------------------------------------

def score(case: str, noise_model: str, make, seeds: range, step_at: int | None, settings: dict) -> dict:
    """Change points of each seeded series: found (any), found within REACH of the step, and the
    change points elsewhere (false ones) per 100 series; the points' spread (sd / mean before the
    step, the median over series)."""
    found = near = false = 0
    spread = []
    steps = progress.bar(desc=f"{case} {noise_model}", total=len(seeds), unit="series", every=0.1)
    for seed in seeds:
        x = make(seed)
        before = x[:step_at or len(x)]
        spread.append(before.std(ddof=1) / before.mean())
        points = [c.index for c in changes.change_points(x, **settings)]
        hits = [i for i in points if step_at is not None and abs(i - step_at) <= REACH]
        found += bool(points)
        near += bool(hits)
        false += len(points) - (1 if hits else 0)
        steps.update()
    steps.close()
    row = {"case": case, "noise": noise_model, "series": len(seeds), "first_seed": seeds.start,
           "step_at": step_at, "found": found / len(seeds), "false_per_100": 100.0 * false / len(seeds),
           "point_cv": float(np.median(spread))}
    if step_at is not None:
        row["found_at_step"] = near / len(seeds)
    return row


def detection_cases(seeds: range, settings: dict) -> list[dict]:
    rows = []
    for model in NOISES:
        rows.append(score("step 5%, 30+30 points", model, lambda s, m=model: synthetic(m, s, False), seeds, SIDE,
                          settings))
    for model in NOISES:
        rows.append(score("flat, 200 points", model, lambda s, m=model: synthetic(m, s, True), seeds, None, settings))
    for metric in AB_METRICS:
        units = aa_units(metric)
        medians = np.array([np.median(u) for u in units])
        for how in AB_POINTS:
            for step in (False, True):
                case = f"A/A {metric}, 200 points" + (", step 5% at 100" if step else ", flat")
                row = score(case, how, lambda s, u=units, h=how, st=step: resampled(u, h, s, st), seeds,
                            PLANT_AT if step else None, settings)
                row.update(units=len(units), unit_cv=float(medians.std(ddof=1) / medians.mean()))
                rows.append(row)
    return rows


# -- timing ---------------------------------------------------------------------------------------

PLATFORMS, RUNS, CONFIGS = 5, 1000, 4
BENCH_METRICS = ("tokens_per_sec", "speedup", "acceptance_rate", "mean_accepted_length", "speedup_vs_reference")


def origin(platform: int, i: int, commit: str | None = None) -> Provenance:
    hours = i + platform * 7 / 60
    date = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(1.8e9 + 3600 * hours))
    return Provenance(commit=commit or f"{platform:02x}{i:038x}", dirty=False, date=date,
                      platform_id=f"cpu-bench-{platform}-avx512-bf16-2c", cpu_class="avx512-bf16",
                      host_probe={"rates": {"memory_gbs": 10.0}},
                      software={"python": "3.11", "torch": "2.13.0", "transformers": "5", "harness": "0.1"})


def series_values(rng: np.random.Generator) -> np.ndarray:
    """RUNS points: a random level, 2% Gaussian noise, two steps of 3-10% at random runs."""
    levels = np.full(RUNS, rng.uniform(1.0, 20.0))
    for at in rng.integers(50, RUNS - 50, size=2):
        levels[at:] *= 1.0 + rng.choice([-1, 1]) * rng.uniform(0.03, 0.10)
    return levels * (1.0 + SPREAD * rng.standard_normal(RUNS))


def build_history(path: Path, seed: int = 7) -> dict:
    """PLATFORMS x RUNS bench runs of CONFIGS x 5 metrics: 100 series of RUNS points."""
    rng = np.random.default_rng(seed)
    names = [(f"bench:pair-{c}:bf16+w8af32:code:assisted k={4 + c}", m) for c in range(CONFIGS) for m in BENCH_METRICS]
    values = {(p, name): series_values(rng) for p in range(PLATFORMS) for name in names}
    start = time.perf_counter()
    steps = progress.bar(desc="build history", total=PLATFORMS * RUNS, unit="run", every=0.1)
    with store.open_store(path) as s:
        for i in range(RUNS):
            for p in range(PLATFORMS):
                ms = tuple(Measurement(c, m, float(values[p, (c, m)][i]), None, None, 8, None) for c, m in names)
                s.append(Run("bench", origin(p, i), ms))
                steps.update()
    steps.close()
    return {"series": len(values), "points": RUNS, "rows": len(values) * RUNS, "runs": PLATFORMS * RUNS,
            "build_s": time.perf_counter() - start, "file_mb": path.stat().st_size / 1e6}


def time_cli(path: Path) -> dict:
    """`python -m harness history changes --history PATH`, wall time from the interpreter's start."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "harness", "history", "changes", "--history", str(path)],
                       cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"history changes failed ({r.returncode}): {r.stderr[-2000:]}")
    return {"cli_wall_s": wall, "cli_summary": r.stdout.strip().splitlines()[-1]}


def time_in_process(path: Path) -> dict:
    """Reading every point (the store's series()) and detecting in every series, timed apart."""
    start = time.perf_counter()
    with store.open_store(path) as s:
        points = s.series()
    read = time.perf_counter() - start
    start = time.perf_counter()
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for p in points:
        grouped.setdefault((p.measurement.combination, p.measurement.metric, p.platform_id), []).append(
            p.measurement.median)
    found = sum(len(changes.change_points(v)) for v in grouped.values())
    return {"read_s": read, "detect_s": time.perf_counter() - start, "rows_read": len(points),
            "change_points": found}


def gate_run(i: int) -> Run:
    """A perf-ab run of 1-4 combinations x 3 metrics, as a merge gate appends it."""
    combos = 1 + i % 4
    ms = tuple(Measurement(f"qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k{4 + c}", m, 3.0 + i * 1e-3,
                           2.9, 3.1, 16, "pass") for c in range(combos) for m in AB_METRICS)
    return Run("perf-ab", origin(PLATFORMS, RUNS + i, commit=f"{i:040x}"), ms, label="reference abc")


def time_appends(path: Path, count: int, offset: int) -> dict:
    """`count` gate runs appended one by one into a copy of the history: on an open store, and
    opened, appended and closed each time (store.append, what a one-off writer does)."""
    copy = path.with_name("appends.sqlite")
    shutil.copyfile(path, copy)
    held = []
    with store.open_store(copy) as s:
        for i in range(count):
            start = time.perf_counter()
            s.append(gate_run(offset + i))
            held.append(time.perf_counter() - start)
    opened = []
    for i in range(count):
        start = time.perf_counter()
        store.append(copy, gate_run(offset + count + i))
        opened.append(time.perf_counter() - start)
    copy.unlink()
    return {"append_ms": 1e3 * statistics.median(held), "append_max_ms": 1e3 * max(held),
            "append_open_ms": 1e3 * statistics.median(opened), "append_open_max_ms": 1e3 * max(opened)}


def host_load() -> dict:
    """The load average (1, 5, 15 minutes) and the processes running now, this one included."""
    with open("/proc/loadavg") as f:
        fields = f.read().split()
    return {"loadavg": " ".join(fields[:3]), "running": int(fields[3].split("/")[0]), "cpus": os.cpu_count()}


def timing(runs: int, appends: int, work_dir: Path | None) -> dict:
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        path = Path(tmp) / "history.sqlite"
        built = build_history(path)
        each = []
        for r in range(runs):
            load = host_load()
            each.append({**load, **time_cli(path), **time_in_process(path), **time_appends(path, appends, 2 * appends * r)})
            logging.getLogger("harness.progress").info("timing run %d/%d: %s", r + 1, runs, each[-1])
    medians = {k: statistics.median(e[k] for e in each) for k in each[0] if isinstance(each[0][k], float)}
    return {**built, "timing_runs": each, "median": medians}


# -- report ---------------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def detection_table(rows: list[dict]) -> list[str]:
    out = ["| case | noise / history point | points' sd | series | found | at the step +-2 "
           "| false change points per 100 series | target met |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stepped = r["step_at"] is not None
        met = r["found_at_step"] >= TARGET_FOUND if stepped else r["false_per_100"] <= TARGET_FALSE
        out.append(f"| {r['case']} | {r['noise']} | {pct(r['point_cv'])} | {r['series']} | {pct(r['found'])} | "
                   f"{pct(r['found_at_step']) if stepped else '-'} | {r['false_per_100']:.1f} | "
                   f"{'yes' if met else 'NO'} ({'>= 95% at the step' if stepped else '<= 1 per 100'}) |")
    units = {r["case"].split(",")[0]: (r["units"], r["unit_cv"]) for r in rows if "units" in r}
    out += ["", "Noise: " + "; ".join(f"{k}: {v}" for k, v in NOISES.items()) + ".",
            "A/A history points: " + "; ".join(f"{k}: {v}" for k, v in AB_POINTS.items()) + "; "
            + "; ".join(f"{case}: {n} gate arms, their medians' sd {pct(cv)} of their mean"
                        for case, (n, cv) in units.items()) + ".",
            "points' sd: the median over the series of sd / mean of the points before the step."]
    return out


def timing_table(t: dict) -> list[str]:
    m = t["median"]
    rows = [("`history changes` wall, interpreter start included", f"{m['cli_wall_s']:.2f} s", "< 2 s",
             m["cli_wall_s"] < 2.0),
            ("in process: reading the points (store series())", f"{m['read_s']:.2f} s", "", None),
            ("in process: grouping and detecting, 100 series", f"{m['detect_s']:.2f} s", "", None),
            ("append a gate run (3 metrics x 1-4 combinations), store open", f"{m['append_ms']:.1f} ms", "< 50 ms",
             m["append_ms"] < 50.0),
            ("append a gate run, opening and closing the store each time", f"{m['append_open_ms']:.1f} ms",
             "< 50 ms", m["append_open_ms"] < 50.0)]
    out = [f"History: {t['rows']} measurements ({t['series']} series x {t['points']} points, {t['runs']} runs, "
           f"{t['file_mb']:.0f} MB), built in {t['build_s']:.0f} s; medians of {len(t['timing_runs'])} timing runs "
           f"(load average before each: {', '.join(r['loadavg'] for r in t['timing_runs'])}; "
           f"processes running, this one included: {', '.join(str(r.get('running', '?')) for r in t['timing_runs'])}).", "",
           "| timing | median | target | met |", "|---|---|---|---|"]
    for what, value, target, met in rows:
        out.append(f"| {what} | {value} | {target or '-'} | {'-' if met is None else 'yes' if met else 'NO'} |")
    return out


def report(doc: dict) -> str:
    lines = [f"Detector settings: {doc['settings']}; seeds {doc['seeds']}.", ""] + detection_table(doc["detection"])
    if doc.get("timing"):
        lines += [""] + timing_table(doc["timing"])
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        print(report(json.loads(args.from_json.read_text())))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    seeds = range(args.seed_offset, args.seed_offset + args.series)
    settings = {"test": args.test, "window": args.window, "max_pvalue": args.max_pvalue}
    tuned = settings != {"test": changes.TEST, "window": changes.WINDOW, "max_pvalue": changes.MAX_PVALUE}
    if tuned and seeds.start < HELD_OUT:
        raise SystemExit(f"settings other than the detector's defaults are explored on held-out seeds only: "
                         f"--seed-offset {HELD_OUT} or above")
    doc = {"command": " ".join(["python", "benchmarks/changepoint_power.py", *(argv if argv is not None else sys.argv[1:])]),
           "machine": capability.cpuinfo()[0] or "unknown", "cpus": os.cpu_count(), "seeds": f"{seeds.start}..{seeds.stop - 1}",
           "settings": {**settings, "min_magnitude": changes.MIN_MAGNITUDE, "min_size": changes.MIN_SIZE},
           "detection": detection_cases(seeds, settings)}
    if args.timing_runs:
        doc["timing"] = timing(args.timing_runs, args.appends, args.work_dir)
    jsonio.atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(report(doc))
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
