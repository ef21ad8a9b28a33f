"""The tree keeps the shape docs/architecture.md describes: imports flow one way between the rooms
of harness/, functions stay short enough to read, test modules have unique names (pytest's default
import mode cannot hold two of one name), and nothing points at files outside the repository."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.childenv import python_path

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "harness"
# which rooms each room may import (itself always); quant/ is a sibling package any room may use
ALLOWED = {
    "core": set(),
    "machine": {"core"},
    "workload": {"core", "machine"},
    "measure": {"core", "machine", "workload"},
    "history": {"core", "machine", "workload", "measure"},
    "perf": {"core", "machine", "workload", "measure", "history"},
    "sandbox": {"core"},
    "accuracy": {"core", "machine", "workload", "measure", "sandbox"},
    "cli": {"core", "machine", "workload", "measure", "history", "perf", "sandbox", "accuracy"},
}
MAX_FUNCTION_LINES = 60


def python_files(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (REPO / r).rglob("*.py"))


def harness_imports(path: Path) -> set[str]:
    """Every harness.<room> a module imports, at any depth (function-level imports included)."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        rooms |= {n.split(".")[1] for n in names if n.startswith("harness.") and n.count(".") >= 1}
    return rooms


def test_every_module_lives_in_a_room():
    loose = [p.name for p in HARNESS.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the rooms of harness/: {loose}"
    assert {p.name for p in HARNESS.iterdir() if (p / "__init__.py").exists()} == set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_flow_one_way(room):
    bad = []
    for path in (HARNESS / room).rglob("*.py"):
        for other in harness_imports(path) - ALLOWED[room] - {room}:
            if other in ALLOWED:
                bad.append(f"{path.relative_to(REPO)} imports harness.{other}")
    assert not bad, f"harness/{room} may import only {sorted(ALLOWED[room]) or 'itself'}: " + "; ".join(bad)


def test_functions_are_short():
    long = []
    for path in python_files("harness", "quant", "benchmarks"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"split into named steps (over {MAX_FUNCTION_LINES} lines): {long}"


def test_test_module_names_are_unique():
    seen: dict[str, Path] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a name: pytest -m perf stops with " \
                                      "'import file mismatch'; rename one"
        seen[path.name] = path


OUTSIDE = re.compile(r"FACTS\.md|DESIGN\.md|\.\./shared|shared/(FACTS|DESIGN)")


def test_nothing_points_outside_the_repository():
    files = [p for p in REPO.rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".toml", ".json", ".txt", ""}
             and not any(part.startswith(".") or part in {"results", "build", "__pycache__"} or part.endswith(".egg-info")
                         for part in p.relative_to(REPO).parts)]
    hits = [f"{p.relative_to(REPO)}:{n}" for p in files if p != Path(__file__)
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, f"references to files outside the repository (say what is needed here instead): {hits}"


def test_the_two_gates_are_two_rooms():
    """harness/perf/ab (the A/B gate) and harness/perf/stored (the stored-baseline gate) share only
    what sits beside them in harness/perf; neither imports the other."""
    bad = []
    for room, other in (("ab", "stored"), ("stored", "ab")):
        for path in (HARNESS / "perf" / room).rglob("*.py"):
            text = path.read_text()
            if re.search(rf"harness\.perf\.{other}\b|from harness\.perf import [^\n]*\b{other}\b", text):
                bad.append(f"{path.relative_to(REPO)} imports harness.perf.{other}")
    assert not bad, "; ".join(bad)


def test_no_class_of_the_suite_shadows_a_builtin():
    """An exception named like a builtin (ReferenceError, TimeoutError) hides the builtin in its module
    and reads as the builtin everywhere else."""
    import builtins

    shadowing = []
    for path in sorted((REPO / "harness").rglob("*.py")) + sorted((REPO / "quant").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and hasattr(builtins, node.name):
                shadowing.append(f"{path.relative_to(REPO)}: class {node.name}")
    assert not shadowing, shadowing


def test_loading_the_perf_plugin_imports_no_model_library():
    """pytest loads the perf plugin in every session (entry point): torch and transformers come in
    when a gate first runs a model (or the CPU class is detected), so that `pytest --help`, a usage
    error or a test run without perf tests does not wait seconds for them."""
    code = "import sys, harness.perf.plugin; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_a_perf_session_with_no_model_to_run_imports_no_model_library(tmp_path):
    """`pytest -m perf --collect-only`, a usage error or a session whose perf tests are all skipped
    waits for no import of torch where the CPU class is known (its cache) and the host has no GPU:
    the CUDA combinations are skipped from the device nodes alone. The first process warms the
    cache; the second is checked."""
    code = ("import sys, pytest; from harness.machine import platform; "
            "platform.GPU_DEVICE_NODES = ('/nonexistent/nvidiactl',); "
            "rc = pytest.main(['tests/perf', '-k', 'cuda', '-rs', '-q', '-p', 'no:cacheprovider']); "
            "print('IMPORTED', sorted({'torch', 'transformers'} & set(sys.modules)), rc)")
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path), "PYTHONPATH": python_path(REPO)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                           timeout=300) for _ in range(2)]
    assert "IMPORTED ['torch'] 0" in runs[0].stdout, runs[0].stdout[-2000:] + runs[0].stderr
    assert "IMPORTED [] 0" in runs[1].stdout, runs[1].stdout[-2000:] + runs[1].stderr
    assert "no CUDA device (no /nonexistent/nvidiactl on this host)" in runs[1].stdout
