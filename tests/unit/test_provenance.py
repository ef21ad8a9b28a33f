"""Where a results file came from (harness/machine/provenance.py): the commit and a dirty tree read
from a real git checkout, nothing invented outside one, and the record the schemas hold."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from harness.core import jsonio
from harness.machine import provenance
from harness.core.errors import ResultsError
from harness.perf import report
from harness.workload.registry import PACKAGE_DIR


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def checkout(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    tree.mkdir()
    git("init", "-q", cwd=tree)
    (tree / "f.py").write_text("x = 1\n")
    git("add", "f.py", cwd=tree)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one", cwd=tree)
    return tree


def test_the_commit_and_a_dirty_tree_come_from_git(tmp_path):
    tree = checkout(tmp_path)
    head = git("rev-parse", "HEAD", cwd=tree)
    assert provenance.git_state(tree) == (head, False)
    (tree / "untracked.txt").write_text("results are not code")
    assert provenance.git_state(tree) == (head, False)  # untracked files do not make it dirty
    (tree / "f.py").write_text("x = 2\n")
    assert provenance.git_state(tree) == (head, True)


def test_outside_a_checkout_nothing_is_invented(tmp_path):
    assert provenance.git_state(tmp_path) == (None, None)
    origin = provenance.collect(tree=tmp_path)
    assert origin.commit is None and origin.dirty is None


def test_the_record_names_the_machine_and_the_software():
    origin = provenance.collect(host_probe={"rates": {"memory_gbs": 1.0}})
    from harness.machine import platform

    info = platform.detect("cpu")
    assert origin.platform_id == info.id and origin.cpu_class == info.capability
    assert origin.software["torch"] == info.torch and "harness" in origin.software
    assert origin.date.endswith("+00:00")


def test_both_results_schemas_hold_the_record_and_nothing_else():
    """The schemas' provenance is the dataclass's fields, the same in bench's and the perf gate's files."""
    fields = {f.name for f in dataclasses.fields(provenance.Provenance)}
    schemas = [json.loads((PACKAGE_DIR / "schemas" / name).read_text())
               for name in ("bench-results.schema.json", "perf-results.schema.json")]
    defs = [s["properties"]["provenance"] for s in schemas]
    assert defs[0] == defs[1]
    assert set(defs[0]["properties"]) == set(defs[0]["required"]) == fields
    doc = {"schema_version": report.SCHEMA_VERSION, "harness_version": "x", "created": "now", "results": [],
           "provenance": provenance.collect().as_dict()}
    jsonio.validate(doc, PACKAGE_DIR / "schemas" / "perf-results.schema.json", "results", ResultsError)
    doc["provenance"]["commit"] = "not a sha"
    with pytest.raises(ResultsError, match="provenance/commit"):
        jsonio.validate(doc, PACKAGE_DIR / "schemas" / "perf-results.schema.json", "results", ResultsError)
