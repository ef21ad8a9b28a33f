"""Reports of a perf session: the terminal summary, results.json (versioned, schema-checked),
summary.md, speedup.png (plain against assisted tokens/s, with the speedup, per combination) and,
for the A/B gate, ab.png (the per-round candidate/base ratios with each verdict and its interval)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any


from harness import __version__
from harness.core import descriptive, jsonio
from harness.core.errors import ResultsError
from harness.measure import phases
from harness.machine.provenance import Provenance
from harness.workload.registry import PACKAGE_DIR
from harness.perf.outcome import Outcome
from harness.perf.ab import paired
from harness.perf.stored import host
from harness.perf.record import CombinationResult

SCHEMA = PACKAGE_DIR / "schemas" / "perf-results.schema.json"
SCHEMA_VERSION = 9  # 2: one record per combination (harness/perf/record.py), rounds in place of per-metric lists;
#                    3: provenance (harness/machine/provenance.py); 4: each round's phases (harness/measure/phases.py)
#                    5: the A/B arms' Python environments (harness/perf/ab/environment.py)
#                    6: the side-by-side arms' exchange of cores within a round (harness/perf/ab/duet.py)
#                    7: the rounds the stand-in covered (harness/perf/ab/standin.py)
#                    8: the rounds whose runs both arms started together (harness/perf/ab/worker.py, sync)
#                    9: each round's page faults (harness/core/timing.py thread_page_faults)
HEADERS = ["Combination", "Plain tok/s", "Assisted tok/s", "Speedup", "Acceptance", "Rounds", "Verdict", "Detail"]


def _metric(r: dict[str, Any], name: str) -> list[float]:
    return [rd[name] for rd in r["rounds"]]


def _row(r: dict[str, Any]) -> list[str]:
    def med(key: str, fmt: str) -> str:
        m = descriptive.median(_metric(r, key))
        return "-" if m is None else format(m, fmt)

    detail = ""
    if r["gate"] == "ab":
        ab = r["ab"]
        detail = f"{ab['mode']}, vs base {ab['base']}: " + ", ".join(
            "{} {:+.1f}% [{:+.1f}, {:+.1f}]".format(m.replace("_tokens_per_sec", "") + (" time" if d.get("cost") else ""),
                                                    *paired.shown(d["change"], d["ci_low"], d["ci_high"], d.get("cost", False)))
            for m, d in r["decisions"].items())
        if ab["behaviour_changes"]:
            detail += f", counters differ on {len(ab['behaviour_changes'])} prompt(s)"
    elif r["verdict"] == Outcome.DEFERRED:
        detail = f"host probe {r['host']['headline']} than the baseline's host: gate it A/B ({host.AB_COMMAND})"
    elif r["decisions"]:
        detail = ", ".join(f"{m.replace('_tokens_per_sec', '')} {(d['ratio'] - 1) * 100:+.1f}% "
                           f"(tol {d['tolerance']:.0%})" for m, d in r["decisions"].items())
        if r.get("exact"):
            detail += f", exact {r['exact']}"
    elif r["tolerance"]:
        detail = "tolerance " + ", ".join(f"{m.replace('_tokens_per_sec', '')} {v:.0%}"
                                         for m, v in r["tolerance"].items() if m != "source")
    acc = "-" if r.get("acceptance_rate") is None else f"{r['acceptance_rate']:.0%}"
    return [r["combination"], med("plain_tokens_per_sec", ".2f"), med("assisted_tokens_per_sec", ".2f"),
            med("speedup", ".2f") + "x", acc, str(len(r["rounds"])), r["verdict"].upper(), detail]


def summary_lines(results: list[CombinationResult]) -> list[str]:
    rows = [_row(r.to_json()) for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADERS)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(HEADERS), fmt(["-" * w for w in widths]), *(fmt(row) for row in rows)]


def write_all(records: list[CombinationResult], directory: Path, origin: Provenance) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    results = [r.to_json() for r in records]
    doc = {"schema_version": SCHEMA_VERSION, "harness_version": __version__,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "provenance": origin.as_dict(), "results": results}
    jsonio.validate(doc, SCHEMA, f"perf results for {directory}", ResultsError)
    jsonio.atomic_write_text(directory / "results.json", jsonio.dumps(doc, str(directory), ResultsError))
    rows = [_row(r) for r in results]
    md = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)] + ["| " + " | ".join(r) + " |" for r in rows]
    jsonio.atomic_write_text(directory / "summary.md", "\n".join(md) + "\n")
    chart(results, directory / "speedup.png")
    ab = [r for r in results if r["gate"] == "ab"]
    if ab:
        ab_chart(ab, directory / "ab.png")


def chart(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["combination"] for r in results]
    plain = [descriptive.median(_metric(r, "plain_tokens_per_sec")) or 0 for r in results]
    assisted = [descriptive.median(_metric(r, "assisted_tokens_per_sec")) or 0 for r in results]
    speedup = [descriptive.median(_metric(r, "speedup")) or 0 for r in results]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(names) + 2), 4.8))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], plain, width=0.4, label="plain", color="#8c8c8c")
    ax.bar([x + 0.2 for x in xs], assisted, width=0.4, label="assisted", color="#2a7ab9")
    for x, a, s, r in zip(xs, assisted, speedup, results):
        outcome = Outcome(r["verdict"])
        flag = f" {outcome.word}" if outcome in (Outcome.REGRESSION, Outcome.UNDECIDED, Outcome.DEFERRED) else ""
        ax.annotate(f"{s:.2f}x{flag}", (x + 0.2, a), ha="center", va="bottom", fontsize=9,
                    color={Outcome.REGRESSION: "#b22222", Outcome.UNDECIDED: "#c07000"}.get(outcome, "black"))
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s (median)")
    ax.set_title("Plain vs assisted decoding, speedup per combination")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def ab_chart(results: list[dict[str, Any]], path: Path) -> None:
    """One panel per A/B combination: every round's candidate/base ratio per metric, the interval of
    its geometric mean, the threshold at -T/2, and the verdict; both arms named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"plain_tokens_per_sec": "#8c8c8c", "assisted_tokens_per_sec": "#2a7ab9", "speedup": "#2e8b57",
              "target_step": "#d2691e", "verify": "#8b008b", "draft_step": "#b8860b", "overhead": "#4b0082"}
    colors.update({cpu: colors[wall] for wall, cpu in phases.CPU_TIME_OF.items()})  # a phase's CPU time: hollow
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 3.2 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        metrics = len(r["ab"]["ratios"])
        spacing = 0.8 / max(metrics, 1)  # a round's metrics side by side within it
        for i, (metric, ratios) in enumerate(r["ab"]["ratios"].items()):
            d = r["decisions"][metric]
            x = [n + 1 + (i - metrics / 2) * spacing for n in range(len(ratios))]
            shown = paired.shown(d["change"], d["ci_low"], d["ci_high"], d.get("cost", False))
            hollow = metric in phases.CPU_TIME_OF.values()
            ax.scatter(x, ratios, s=12, alpha=0.6, edgecolors=colors.get(metric, "black"),
                       facecolors="none" if hollow else colors.get(metric, "black"),
                       label="{}: {} {:+.1f}% [{:+.1f}, {:+.1f}]".format(
                           metric.replace("_tokens_per_sec", " tok/s") + (" time" if d.get("cost") else ""),
                           d["verdict"].upper(), *shown))
            ax.axhspan(d["ci_low"], d["ci_high"], color=colors.get(metric, "black"), alpha=0.12)
        tolerance = next(iter(r["decisions"].values()))["tolerance"]
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1 - tolerance / 2, color="#b22222", lw=0.8, ls="--", label=f"threshold -{tolerance / 2:.0%}")
        ax.set_title(f"{r['combination']}: {r['verdict'].upper()}\ncandidate {r['ab']['candidate']} vs base {r['ab']['base']} ({r['ab']['mode']})",
                     fontsize=9)
        ax.set_xlabel("paired round")
        ax.set_ylabel("candidate / base\n(phases: base / candidate)")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _save(fig, path)
