"""A/B across environments (harness/perf/ab/environment.py): the base arm runs in another Python
environment. An overlay built from a spec differs from this environment in exactly the packages
the spec installed, is reused while nothing changed, and a spec that cannot be built or imported
is one line naming it, with nothing kept. The planted copy of transformers
(harness/perf/plant_package.py) slows every decoder layer, and a live gate on tiny models names
both environments and the package they differ in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.perf import plant_package
from harness.perf.ab import environment
from harness.perf.ab.environment import ArmEnvironmentError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("envcache")
    old = os.environ.get("HARNESS_CACHE_DIR")
    os.environ["HARNESS_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("HARNESS_CACHE_DIR")
    else:
        os.environ["HARNESS_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def here():
    return environment.current()


@pytest.fixture(scope="module")
def filelock_copy(cache, here):
    """An overlay in which filelock is a local copy (`+copy`): one package differs, offline."""
    wheel = plant_package.wheel_of("filelock", cache / "wheels", local="copy")
    lines: list[str] = []
    return environment.build(str(wheel), here, say=lines.append), lines, wheel


def run(python: str, code: str) -> str:
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def leftovers(cache: Path) -> list[str]:
    """What builds left in the environment cache besides finished environments."""
    envs = cache / "envs"
    return sorted(p.name for p in envs.iterdir() if not (p / "ready").is_file()) if envs.exists() else []


def test_an_overlay_differs_in_the_one_package_it_installed(filelock_copy, here, cache):
    env, lines, _ = filelock_copy
    version = here.packages["filelock"]
    assert env.differences(here) == {"filelock": (f"{version}+copy", version)}
    assert env.versions["torch"] == here.versions["torch"] and env.versions["transformers"] == here.versions["transformers"]
    where = json.loads(run(env.python, "import json, filelock, torch; print(json.dumps([filelock.__file__, torch.__file__]))"))
    assert where[0].startswith(str(cache / "envs")), where  # its own copy first
    assert not where[1].startswith(str(cache / "envs")), where  # torch from this environment, not copied
    assert any(line.endswith("Successfully installed filelock-" + version + "+copy") for line in lines), lines
    assert leftovers(cache) == []


def test_an_overlay_is_built_once_and_reused(filelock_copy, here):
    env, _, wheel = filelock_copy
    again: list[str] = []
    assert environment.build(str(wheel), here, say=again.append).python == env.python
    assert len(again) == 1 and "reusing" in again[0], again


def fake_environment(root: Path, name: str, parent: str, days_ago: float = 0) -> Path:
    """A finished environment's folder as build() leaves it (its ready file names its parent)."""
    folder = root / name
    (folder / "bin").mkdir(parents=True)
    (folder / "ready").write_text(json.dumps({"spec": "x==1", "parent": parent}) + "\n")
    stamp = time.time() - days_ago * 86400
    os.utime(folder, (stamp, stamp))
    return folder


def test_a_reuse_removes_the_environments_whose_parent_is_gone_or_that_went_unused(filelock_copy, here, cache):
    """Every clean CI clone builds an overlay of its own .venv (125 MB): once the clone is deleted it
    cannot run, and it goes at the next build or reuse; so does one unused for two weeks."""
    env, _, wheel = filelock_copy
    envs = cache / "envs"
    orphan = fake_environment(envs, "0rphan0000000000", "/nonexistent/clone/.venv/bin/python")
    stale = fake_environment(envs, "5ta1e00000000000", sys.executable, days_ago=15)
    recent = fake_environment(envs, "rec3nt0000000000", sys.executable, days_ago=13)
    environment.build(str(wheel), here)
    assert not orphan.exists() and not stale.exists()
    assert recent.exists() and Path(env.python).exists()


def test_an_environment_in_use_by_a_build_is_not_removed(tmp_path, cache):
    from harness.core import locks
    from harness.workload.models import lock_file

    orphan = fake_environment(tmp_path, "b0sy000000000000", "/nonexistent/bin/python")
    with locks.held(lock_file("env-b0sy000000000000"), what="a build", guards=orphan):
        assert environment.prune(tmp_path) == []
    assert environment.prune(tmp_path) == [orphan] and not orphan.exists()
    locks.sweep_orphans(lock_file("env-b0sy000000000000").parent)
    assert not lock_file("env-b0sy000000000000").exists(), "its lock goes with it"


def test_a_spec_pip_cannot_install_names_the_package_and_keeps_nothing(cache, here, tmp_path):
    spec = tmp_path / "requirements.txt"
    spec.write_text("--no-index\nassisted-bench-absent==1.0\n")
    with pytest.raises(ArmEnvironmentError) as err:
        environment.build(str(spec), here)
    message = str(err.value)
    assert message.startswith(f"--perf-base-env {spec}: pip could not install assisted-bench-absent==1.0")
    assert "no environment was kept" in message and "\n" not in message
    assert leftovers(cache) == []


@pytest.mark.parametrize("label", [None, "the candidate's environment (env:0.1)"])
def test_an_environment_that_cannot_import_transformers_is_refused_and_removed(cache, here, label):
    broken = plant_package.write_wheel(cache / "wheels", "transformers", "0.0.1+broken",
                                       {"transformers/__init__.py": b"raise ImportError('planted: broken on import')\n"})
    named = re.escape(label) if label else re.escape(f"--perf-base-env {broken}")  # the option once, then the spec
    with pytest.raises(ArmEnvironmentError, match=rf"^{named}: it cannot run a worker: ImportError: planted: broken on "
                                                  r"import$"):
        environment.build(str(broken), here, label=label)
    assert leftovers(cache) == []


def test_a_base_python_that_is_not_one_is_named(tmp_path):
    with pytest.raises(ArmEnvironmentError, match="--perf-base-python .*nowhere/python: no such interpreter"):
        environment.from_python(str(tmp_path / "nowhere" / "python"))
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    with pytest.raises(ArmEnvironmentError, match="cannot run a worker: ModuleNotFoundError: No module named 'torch'"):
        environment.from_python(str(bare / "bin" / "python"))


@pytest.mark.planted
def test_the_planted_transformers_slows_every_decoder_layer(cache, here, tmp_path):
    """A tiny llama's forward pass, timed in this environment and in two overlays: one whose
    transformers spins 3x each decoder layer's time is clearly slower, the unplanted copy is not.
    One thread, the 10th percentile of 150 passes, the three interleaved twice and each one's best
    kept: a burst on a shared host only ever adds time."""
    timing = ("import time, torch, sys; sys.path.insert(0, %r); from tiny_models import tiny_model, prompt\n"
              "torch.set_num_threads(1)\n"
              "m = tiny_model('llama', seed=0, layers=4, hidden=128); ids = prompt(length=64)\n"
              "with torch.no_grad():\n"
              "    [m(ids) for _ in range(5)]\n"
              "    ts = []\n"
              "    for _ in range(150):\n"
              "        t = time.perf_counter(); m(ids); ts.append(time.perf_counter() - t)\n"
              "print(sorted(ts)[len(ts) // 10])") % str(REPO / "tests" / "unit")
    planted = environment.build(str(plant_package.transformers_wheel(tmp_path, 3.0)), here)
    copy = environment.build(str(plant_package.transformers_wheel(tmp_path, 0.0)), here)
    assert planted.differences(here) == {"transformers": (here.packages["transformers"] + "+planted3.00",
                                                          here.packages["transformers"])}
    assert copy.differences(here) == {"transformers": (here.packages["transformers"] + "+copy",
                                                       here.packages["transformers"])}
    envs = {"here": here, "planted": planted, "copy": copy}
    times: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(2):
        for name, env in envs.items():
            times[name].append(float(run(env.python, timing)))
    best = {name: min(ts) for name, ts in times.items()}
    assert best["planted"] > 2.0 * best["here"], best
    assert best["copy"] < 1.4 * best["here"], best


def test_a_copied_wheel_is_the_same_bytes_each_time(tmp_path):
    """The environment cache keys on the wheel's hash: writing the same copy again must not make
    another environment."""
    first = plant_package.wheel_of("filelock", tmp_path / "a", local="copy").read_bytes()
    assert plant_package.wheel_of("filelock", tmp_path / "b", local="copy").read_bytes() == first
