"""`history plot` and `history report` (harness/history/plot.py, report.py): a history with a planted
10% step is drawn as one valid PNG per series with the step's commit range on it, and published as one
HTML page that needs no network (every image inside it), names the step's commits, says REGRESSION,
shows the last run's verdicts, and escapes what the history holds."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import logging
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.history import plot, report, series, store
from harness.history.store import Measurement, Run
from test_cli import cli
from test_history_store import origin

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PERF = "qwen-coder-1.5b+0.5b:bf16+w8af32-tensor:cpu:greedy:k8"
BENCH = "bench:p<i>&</i>:greedy"  # markup in a name: the page must escape it
OTHER_PLATFORM = "cpu-y-amx-8c"
STEP_AT = 12  # the first run of the 10% slower commit


def sha(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def date(i: int) -> str:
    return f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00+00:00"


def perf_run(i: int, plain: float, speedup: float, verdict: str = "pass", platform: str | None = None) -> Run:
    where = origin(sha(i), date(i))
    if platform:
        where = dataclasses.replace(where, platform_id=platform)
    return Run("perf-ab", where, (
        Measurement(PERF, "plain_tokens_per_sec", plain, plain * 0.98, plain * 1.02, 8, verdict),
        Measurement(PERF, "speedup", speedup, speedup * 0.97, speedup * 1.03, 8, "pass")), label="reference abc")


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """24 perf runs on one platform with plain tokens/s 10% lower from run STEP_AT on (1% noise) and the
    last run's gate saying REGRESSION; 6 runs on another platform; 8 bench runs without intervals."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    rng = np.random.default_rng(7)
    with store.open_store(path) as s:
        for i in range(24):
            plain = (10.0 if i < STEP_AT else 9.0) * (1 + 0.01 * rng.standard_normal())
            s.append(perf_run(i, plain, 3.0 * (1 + 0.01 * rng.standard_normal()),
                              verdict="regression" if i == 23 else "pass"))
        for i in range(30, 36):
            s.append(perf_run(i, 20.0 + 0.1 * (i % 2), 2.5, platform=OTHER_PLATFORM))
        for i in range(40, 48):
            s.append(Run("bench", origin(sha(i), date(i)),
                         (Measurement(BENCH, "tokens_per_sec", 5.0 + 0.05 * (i % 3), None, None, 8, None),)))
    return path


def analysed(path: Path) -> list[series.Series]:
    with store.open_store(path) as s:
        return series.analyse(series.group(s.series()))


def stepped(all_series: list[series.Series]) -> series.Series:
    return next(s for s in all_series if s.metric == "plain_tokens_per_sec" and s.platform_id == origin().platform_id)


def test_the_planted_step_is_found_with_its_commit_range(history):
    all_series = analysed(history)
    assert len(all_series) == 5  # plain and speedup on two platforms, bench tokens/s
    [step] = stepped(all_series).steps
    assert step.change.index == STEP_AT and step.regression
    assert step.before.commit == sha(STEP_AT - 1) and step.after.commit == sha(STEP_AT)
    assert step.commit_range == f"{sha(STEP_AT - 1)[:12]}..{sha(STEP_AT)[:12]}"
    assert [s.steps for s in all_series if s is not stepped(all_series)] == [()] * 4


def test_plot_writes_one_valid_png_per_series(history, tmp_path):
    all_series = analysed(history)
    out = tmp_path / "plots"
    paths = list(plot.write_all(all_series, out))
    assert len(paths) == len(set(paths)) == len(all_series)
    assert sorted(out.iterdir()) == sorted(paths)  # nothing else left there (no temporary files)
    for path in paths:
        assert path.suffix == ".png" and not set(path.name) & set(":/<>&")
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
        with Image.open(io.BytesIO(data)) as image:
            assert image.size == (round(9 * plot.DPI), round(4.4 * plot.DPI))


def test_the_figure_marks_the_step_and_labels_it_with_its_commit_range(history):
    s = stepped(analysed(history))
    commit_range = f"{sha(STEP_AT - 1)[:12]}..{sha(STEP_AT)[:12]}"
    [label] = plot.annotations(s)
    assert s.steps[0].change.magnitude == pytest.approx(-0.10, abs=0.015)
    assert commit_range in label and "REGRESSION" in label and f"{s.steps[0].change.magnitude:+.1%}" in label
    ax = plot.figure(s).axes[0]
    assert label in [t.get_text() for t in ax.texts]  # drawn, not only computed
    vertical = [line for line in ax.lines if list(line.get_xdata()) == [STEP_AT - 0.5, STEP_AT - 0.5]]
    assert len(vertical) == 1
    means = sorted(round(float(seg[0][1]), 6) for c in ax.collections if hasattr(c, "get_segments")
                   for seg in c.get_segments() if len(seg) == 2 and seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0])
    assert means == sorted(round(x, 6) for x in (s.steps[0].change.mean_before, s.steps[0].change.mean_after))
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert sha(STEP_AT - 1)[:8] in ticks and sha(STEP_AT)[:8] in ticks


class Page(HTMLParser):
    """What a browser would see: images, links, tables (rows of cell texts) and the text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.images: list[dict[str, str]] = []
        self.urls: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self.tags: list[str] = []
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v is not None]
        if tag == "img":
            self.images.append(a)
        elif tag == "table":
            self._table = self.tables.setdefault(a.get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parsed(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


@pytest.fixture(scope="module")
def page(history) -> tuple[str, Page]:
    html = report.render(analysed(history), report.Scope(str(history)), generated="2026-12-01T00:00:00+00:00")
    return html, parsed(html)


def test_the_report_holds_one_embedded_png_per_series_and_nothing_from_the_network(page, history):
    html, p = page
    assert len(p.images) == len(analysed(history)) == 5
    for img in p.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix) and img.get("alt")
        data = base64.b64decode(img["src"][len(prefix):], validate=True)
        assert data.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(data)) as image:
            assert image.size[0] > 100 and image.size[1] > 100
    assert p.urls and not [u for u in p.urls if not (u.startswith("data:image/png;base64,") or u.startswith("#"))]
    assert "http://" not in html and "https://" not in html
    assert "script" not in p.tags and "link" not in p.tags
    assert "<i>&</i>" not in html and BENCH in "".join(p.text)  # escaped, and reads as written


def test_the_change_point_row_names_the_commit_range_and_says_regression(page):
    _, p = page
    header, *rows = p.tables["changes"]
    assert header[:2] == ["series", "direction"] and "commit range" in header
    [row] = rows
    cell = dict(zip(header, row))
    assert cell["commit range"] == f"{sha(STEP_AT - 1)[:12]}..{sha(STEP_AT)[:12]}"
    assert cell["direction"] == "REGRESSION" and cell["magnitude"][:3] in ("-10", "-9.")
    assert PERF in cell["series"] and "plain_tokens_per_sec" in cell["series"] and origin().platform_id in cell["series"]


def test_the_latest_verdicts_are_those_of_the_last_run(page):
    _, p = page
    header, *rows = p.tables["latest"]
    by_key = {(r[0], r[1]): dict(zip(header, r)) for r in rows}
    assert set(by_key) == {(PERF, origin().platform_id), (PERF, OTHER_PLATFORM), (BENCH, origin().platform_id)}
    last = by_key[(PERF, origin().platform_id)]
    assert last["last run"] == date(23) and last["commit"] == sha(23)[:12] and last["kind"] == "perf-ab"
    assert last["verdict per metric"] == "plain_tokens_per_sec REGRESSION speedup PASS"
    assert by_key[(BENCH, origin().platform_id)]["verdict per metric"] == "tokens_per_sec -"


def test_the_header_names_the_history_runs_platforms_and_dates(page, history):
    _, p = page
    text = " ".join(" ".join(p.text).split())
    assert str(history) in text and "runs 38" in text and "2026-12-01T00:00:00+00:00" in text
    assert origin().platform_id in text and OTHER_PLATFORM in text
    assert f"{date(0)} to {date(47)}" in text


def test_the_report_logs_one_progress_line_per_series(history, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="harness.progress")
    out = report.write(tmp_path / "r" / "history.html", analysed(history), report.Scope(str(history)))
    lines = [r.getMessage() for r in caplog.records if r.name == "harness.progress"]
    assert len(lines) == 5 and lines[-1].startswith("history report: 5/5 series")
    assert [f.name for f in out.parent.iterdir()] == ["history.html"]  # written whole, no temporary left


def test_the_cli_writes_the_report_and_the_plots(history, tmp_path):
    r = cli("history", "report", "--history", str(history), "--out", str(tmp_path / "h.html"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"report: {tmp_path / 'h.html'} (5 series, 1 change point(s))"
    assert len(parsed((tmp_path / "h.html").read_text()).images) == 5
    r = cli("history", "plot", "--history", str(history), "--out", str(tmp_path / "plots"), "--metric", "speedup")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(Path(x).is_file() and Path(x).parent == tmp_path / "plots" for x in lines)


def test_the_cli_says_in_one_line_when_there_is_nothing_to_draw(history, tmp_path):
    missing = cli("history", "report", "--history", str(tmp_path / "none.sqlite"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"error: --history {tmp_path / 'none.sqlite'}: no history there yet; `make bench` or `make perf-ab` start one"]
    empty = tmp_path / "empty.sqlite"
    store.open_store(empty).close()
    for command in ("report", "plot"):
        r = cli("history", command, "--history", str(empty), "--out", str(tmp_path / "out"))
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"error: --history {empty}: no measurements in it yet; nothing to draw"], r.stderr
    r = cli("history", "plot", "--history", str(history), "--combination", BENCH, "--metric", "speedup")
    assert r.returncode == 2 and f"no measurements match --combination {BENCH} --metric speedup" in r.stderr
    assert not (tmp_path / "out").exists()
