"""The perf gate's commands exactly as the README writes them: `pytest -m perf` from the repository
root with no path argument, options in the space-separated form, and the plugin's options known
wherever pytest starts (it is registered by entry point, not by a conftest that a path argument
can move out of reach). Collection only: what the gate measures is tested in test_perf_plugin."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.core import registry


REPO = Path(__file__).resolve().parents[2]
PYTEST = shutil.which("pytest", path=str(Path(sys.executable).parent)) or "pytest"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([PYTEST, *args, "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def collected(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stdout.splitlines() if "::test_perf[" in line]


def test_pytest_m_perf_from_the_repository_root():
    r = run("-m", "perf", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "import file mismatch" not in r.stdout
    ids = collected(r)
    # the default pair with this CPU class's precisions and K (amx: bf16+w8af32-tensor, k6)
    pair = registry.load_matrix().pair("qwen-coder-1.5b+0.5b")
    default = f"qwen-coder-1.5b+0.5b:{pair.precisions}:cpu:greedy:k{pair.num_assistant_tokens}"
    assert f"tests/perf/test_perf_gate.py::test_perf[{default}]" in ids
    assert all("tests/perf/" in line for line in ids)


def test_space_separated_options_with_a_path_value(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    r = run("-m", "perf", "--baselines-dir", str(tmp_path / "elsewhere"), "--pair", "smollm2-135m+self",
            "--platform", "cpu", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = collected(r)
    assert ids and all("smollm2-135m+self:" in i and ":cpu:" in i for i in ids), ids


def test_a_mistyped_baselines_dir_is_a_usage_error(tmp_path):
    """Not a silent switch of every combination to the A/B gate."""
    r = run("-m", "perf", "--baselines-dir", str(tmp_path / "baselnes"), "--collect-only", "-q")
    assert r.returncode == 4 and "--baselines-dir" in r.stderr and "does not exist" in r.stderr, r.stderr[-2000:]


def test_the_options_exist_wherever_pytest_starts(tmp_path):
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for option in ("--baselines-dir", "--update-baselines", "--perf-undecided", "--perf-missing-baseline"):
        assert option in r.stdout


def test_a_bad_option_value_names_the_flag():
    r = run("-m", "perf", "--pair", "qwen-coder-1.5b+0.5", "--collect-only", "-q")
    assert r.returncode == 4
    assert "--pair 'qwen-coder-1.5b+0.5' has no perf combinations. Did you mean 'qwen-coder-1.5b+0.5b'?" in r.stderr
