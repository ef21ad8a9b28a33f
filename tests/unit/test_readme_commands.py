"""The README's commands exactly as it writes them.

Every line of the README's `bash` blocks is checked as a newcomer would type it: a `make` target
exists and its recipe expands (`make -n`), a `python -m harness` command line parses, a `pytest`
command collects from the repository root. Running them for real is `make bench` / `make test`
themselves; this test catches an option renamed or a target removed under the README.

The perf gate's commands also get the details a CI job depends on: `pytest -m perf` from the
repository root with no path argument, options in the space-separated form, and the plugin's
options known wherever pytest starts (it is registered by entry point, not by a conftest that a path
argument can move out of reach). Collection only: what the gate measures is tested in
test_perf_plugin."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import build_parser
from harness.workload import registry


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
    # the default pair with this CPU class's precisions, K and drafting (amx: bf16+w8af32-tensor, k6)
    from harness.perf.combinations import PerfSettings, of_pair

    matrix = registry.load_matrix()
    default = of_pair(matrix, "qwen-coder-1.5b+0.5b", PerfSettings.from_matrix(matrix)).id
    assert f"tests/perf/test_perf_gate.py::test_perf[{default}]" in ids
    assert all("tests/perf/" in line for line in ids)


def test_space_separated_options_with_a_path_value(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    r = run("-m", "perf", "--perf-baselines-dir", str(tmp_path / "elsewhere"), "--perf-pair", "smollm2-135m+self",
            "--perf-platform", "cpu", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = collected(r)
    assert ids and all("smollm2-135m+self:" in i and ":cpu:" in i for i in ids), ids


def test_a_mistyped_baselines_dir_is_a_usage_error(tmp_path):
    """Not a silent switch of every combination to the A/B gate."""
    r = run("-m", "perf", "--perf-baselines-dir", str(tmp_path / "baselnes"), "--collect-only", "-q")
    assert r.returncode == 4 and "--perf-baselines-dir" in r.stderr and "does not exist" in r.stderr, r.stderr[-2000:]


def test_the_options_exist_wherever_pytest_starts(tmp_path):
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for option in ("--perf-baselines-dir", "--perf-update-baselines", "--perf-pair", "--perf-platform",
                   "--perf-undecided", "--perf-missing-baseline"):
        assert option in r.stdout


def test_a_bad_option_value_names_the_flag():
    r = run("-m", "perf", "--perf-pair", "qwen-coder-1.5b+0.5", "--collect-only", "-q")
    assert r.returncode == 4
    assert "--perf-pair 'qwen-coder-1.5b+0.5' has no perf combinations. Did you mean 'qwen-coder-1.5b+0.5b'?" in r.stderr


def test_the_old_spellings_still_work_and_name_their_new_one_once(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    r = run("-m", "perf", "--baselines-dir", str(tmp_path / "elsewhere"), "--pair", "smollm2-135m+self",
            "--platform=cpu", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = collected(r)
    assert ids and all("smollm2-135m+self:" in i and ":cpu:" in i for i in ids), ids
    for old, new in (("--baselines-dir", "--perf-baselines-dir"), ("--pair", "--perf-pair"),
                     ("--platform", "--perf-platform")):
        assert r.stdout.count(f"{old} is now {new}") == 1, r.stdout[-3000:]
    assert "--update-baselines is now" not in r.stdout


def readme_commands() -> list[str]:
    """Each command line of the README's ```bash blocks, its trailing comment removed."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def test_the_readme_has_commands_to_check():
    commands = readme_commands()
    assert any(c.startswith("make ") for c in commands) and any(c.startswith("pytest ") for c in commands)
    assert any(c.startswith("python -m harness ") for c in commands), commands


@pytest.mark.parametrize("command", readme_commands())
def test_a_readme_command_runs_as_written(command):
    words = shlex.split(command)
    if words[0] == "make":
        r = subprocess.run(["make", "-n", *words[1:]], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 0, f"{command}: {r.stderr[-2000:]}"
    elif words[:3] == ["python", "-m", "harness"]:
        try:
            build_parser().parse_args(words[3:])
        except SystemExit as exc:
            pytest.fail(f"{command}: the CLI refuses it as written (exit {exc.code})")
    elif words[0] == "pytest":
        r = run(*words[1:], "--collect-only", "-q")
        assert r.returncode == 0, f"{command}: " + r.stdout[-2000:] + r.stderr[-2000:]
    else:
        pytest.fail(f"README command {command!r}: this test does not know how to check it; teach it")
