"""Change points in the run history (harness/history/changes.py): E-Divisive means with a t-test finds
a planted step where it is, with its size and direction, finds none in a steady noisy series, and
`history changes --since REV` fails CI only for a regression after REV."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from harness.history import changes, store
from harness.history.store import Measurement, Run
from test_cli import cli
from test_history_store import origin


def noisy(level: float, n: int, seed: int, spread: float = 0.02) -> list[float]:
    return list(level * (1 + spread * np.random.default_rng(seed).standard_normal(n)))


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_planted_step_is_found_where_it_is_with_its_size_and_direction(seed):
    # 10% slower from point 25 on, 1% noise (at 2% a point 2.7 sd low just before the step belongs
    # to the slower side by the data themselves, and the step is found one point early)
    series = noisy(10.0, 25, seed, spread=0.01) + noisy(9.0, 25, seed + 100, spread=0.01)
    [c] = changes.change_points(series)
    assert c.index == 25 and c.magnitude == pytest.approx(-0.10, abs=0.01) and c.pvalue < 1e-6
    assert changes.is_regression("plain_tokens_per_sec", c) and not changes.is_regression("time_per_token_ms", c)


def test_two_steps_in_a_long_series_are_both_found_across_windows():
    series = noisy(10.0, 40, 3) + noisy(11.0, 40, 4) + noisy(9.5, 40, 5)
    found = changes.change_points(series, window=30)
    assert [c.index for c in found] == [40, 80]
    assert [round(c.magnitude, 2) for c in found] == pytest.approx([0.10, -0.14], abs=0.015)


@pytest.mark.parametrize("seed", range(6))
def test_a_steady_noisy_series_has_no_change_point(seed):
    assert changes.change_points(noisy(10.0, 120, seed, spread=0.05)) == []


def test_a_step_below_the_minimum_magnitude_is_dropped():
    series = noisy(10.0, 20, 6, spread=0.001) + noisy(9.9, 20, 7, spread=0.001)  # 1%, far above the noise
    assert [c.index for c in changes.change_points(series)] == [20]
    assert changes.change_points(series, min_magnitude=0.02) == []


def _git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_changes_since_a_revision_fails_only_for_a_regression_after_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shas = []
    for name in ("old", "new"):
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", name)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    history = tmp_path / "history.sqlite"
    values = noisy(10.0, 12, 8) + noisy(9.0, 12, 9)  # the new commit is 10% slower
    with store.open_store(history) as s:
        for i, v in enumerate(values):
            commit = shas[0] if i < 12 else shas[1]
            s.append(Run("bench", origin(commit, f"2026-11-{1 + i:02d}T10:00:00+00:00"),
                         (Measurement("bench:p", "tokens_per_sec", v, None, None, 8, None),)))
    r = cli("history", "changes", "--history", str(history), "--since", shas[0], cwd=repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"REGRESSION +(9\.9|10\.\d)\d* -> (8\.9|9\.\d)\d* \(-(9|10|11)\.\d%, p ", r.stdout), r.stdout
    assert f"between {shas[0][:12]}" in r.stdout and f"and {shas[1][:12]}" in r.stdout and "[after --since]" in r.stdout
    assert "1 regression(s) after" in r.stdout and "1 change point(s) in 1 series" in r.stdout
    ok = cli("history", "changes", "--history", str(history), "--since", shas[1], cwd=repo)
    assert ok.returncode == 0 and "0 regression(s) after" in ok.stdout, ok.stdout + ok.stderr
    bad = cli("history", "changes", "--history", str(history), "--since", "nosuchrev", cwd=repo)
    assert bad.returncode == 2 and "--since nosuchrev: not a revision of this repository" in bad.stderr


@pytest.mark.parametrize("seed", [21, 103, 297])
def test_the_split_is_moved_to_the_least_squares_step_where_q_hat_is_one_point_off(seed):
    """Seeds where q-hat alone puts a 10% step (3% noise) a point off and the least squares do not."""
    series = noisy(10.0, 20, seed, spread=0.03) + noisy(9.0, 20, seed + 1000, spread=0.03)
    tau, _ = changes.qhat(np.asarray(series))
    assert tau != 20  # the case this test is for
    assert [c.index for c in changes.change_points(series)] == [20]
