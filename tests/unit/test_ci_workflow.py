"""The CI recipe (.github/workflows/perf.yml, docs/ci.md) is a workflow GitHub would run as written.

Posting to a pull request cannot be exercised offline, so the workflow is linted: against GitHub's
workflow schema (check-jsonschema's vendored copy) and by zizmor's audits at their strictest
(template injection, token permissions, unpinned actions, credentials left in the checkout). Both
linters install from PyPI with the project's dev extras; a missing one fails the test. Then what the
suite itself needs from CI, each of which a default workflow gets wrong: the history for the
reference commit, CI=true, the model cache where the harness looks, the system packages a runner
that is not root lacks, make test, the history and the results kept whatever the verdict.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "perf.yml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"{name} is not installed: it comes with the dev extras (pip install -e .[dev], or make setup)"
    return found


def lint(path: Path) -> list[subprocess.CompletedProcess]:
    return [
        subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                       capture_output=True, text=True, timeout=120),
        subprocess.run([tool("zizmor"), "--offline", "--persona", "pedantic", "--no-progress", str(path)],
                       capture_output=True, text=True, timeout=120),
    ]


def test_the_workflow_passes_both_linters():
    for r in lint(WORKFLOW):
        assert r.returncode == 0, f"{' '.join(r.args)}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"


@pytest.mark.parametrize("break_it, linter", [
    (lambda t: t.replace("runs-on:", "run-on:"), 0),                                  # not a workflow GitHub runs
    (lambda t: t.replace('--body-file results/perf/summary.md --edit-last',
                         '--body "${{ github.event.pull_request.title }}" --edit-last'), 1),  # template injection
    (lambda t: t.replace("persist-credentials: false", ""), 1),                          # token left on disk
    (lambda t: t.replace("actions/cache@5a3ec84eff668545956fd18022155c47e93e2684", "actions/cache@v4"), 1),  # a tag moves
])
def test_the_linters_catch_a_broken_workflow(tmp_path, break_it, linter):
    """Each linter fails on what it is there for, so a green lint means something."""
    text = WORKFLOW.read_text(encoding="utf-8")
    broken = break_it(text)
    assert broken != text
    path = tmp_path / ".github" / "workflows" / "perf.yml"
    path.parent.mkdir(parents=True)
    path.write_text(broken, encoding="utf-8")
    assert lint(path)[linter].returncode != 0


def test_the_workflow_gives_the_suite_what_it_needs():
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    (job,) = doc["jobs"].values()
    steps = job["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0, "the merge gate needs the reference commit: the whole history"
    assert job["env"]["CI"] == "true"
    cache = next(s for s in steps if s.get("uses", "").startswith("actions/cache@"))
    assert cache["with"]["path"] == job["env"]["HARNESS_CACHE_DIR"], "the cache must be where the harness looks"
    runs = [s.get("run", "") for s in steps]
    test = next(i for i, r in enumerate(runs) if r.startswith("make test") and "JUNIT_DIR=" in r)
    # the runner is not root: the PostgreSQL server and bubblewrap are installed before make test
    assert any("postgres-tools" in r and "sandbox-tools" in r for r in runs[:test])
    # the history is saved whatever the verdict: a failed gate's rounds belong in it too
    restore = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/save@"))
    assert restore < test < save and steps[save]["if"] == "always()"
    assert steps[restore]["with"]["path"] == steps[save]["with"]["path"] == "results/history.sqlite"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "results/"
    assert job["timeout-minutes"] >= 60


def test_make_test_writes_junit_where_the_workflow_asks():
    r = subprocess.run(["make", "-n", "test", "JUNIT_DIR=results/junit"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for stage in ("unit", "accuracy", "perf-ab"):
        assert f"--junitxml=results/junit/{stage}.xml" in r.stdout, r.stdout
