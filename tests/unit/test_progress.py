"""Progress: a bar on a terminal, one log line per finished step in a log (harness/core/progress.py).

A CI log must hold no carriage-return redraws, the suite's own bars' or the libraries' ("Loading
weights"), and still show every finished step; a terminal still gets its bar."""

from __future__ import annotations

import io
import logging
import os
import pty
import subprocess
import sys

import transformers

from harness.core import progress
from tiny_models import write_local_matrix


def test_a_log_gets_one_line_per_finished_step(caplog):
    caplog.set_level(logging.INFO, logger="harness.progress")
    bar = progress.bar(desc="bench tiny", total=3, unit="run", stream=io.StringIO())
    assert isinstance(bar, progress.Steps)
    for i in range(3):
        bar.set_postfix_str(f"p{i} plain 1.0 tok/s")
        bar.update()
    bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("bench tiny: 1/3 run, p0 plain 1.0 tok/s, ") and lines[2].startswith("bench tiny: 3/3 run")
    assert not any("\r" in line for line in lines)


def test_a_byte_count_logs_a_tenth_at_a_time(caplog):
    caplog.set_level(logging.INFO, logger="harness.progress")
    bar = progress.bar(desc="fetch x.gguf", total=1_000_000, unit="B", stream=io.StringIO())
    for _ in range(1000):
        bar.update(1000)
    bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert 10 <= len(lines) <= 11, lines
    assert lines[-1].startswith("fetch x.gguf: 1.0M/1.0M B")


def test_a_disabled_bar_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="harness.progress")
    bar = progress.bar(desc="quiet", total=2, enabled=False, stream=io.StringIO())
    bar.update()
    bar.update()
    bar.close()
    assert caplog.records == []


def test_a_terminal_gets_a_bar():
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            bar = progress.bar(desc="bench tiny", total=2, unit="run", stream=tty)
            assert not isinstance(bar, progress.Steps)
            bar.update(2)
            bar.close()
        assert b"\r" in os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)


def test_the_libraries_bars_are_off_in_a_log_only():
    try:
        progress.library_bars_off_unless_terminal(io.StringIO())
        assert not transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.enable_progress_bar()
        master, slave = pty.openpty()
        with os.fdopen(slave, "w") as tty:
            progress.library_bars_off_unless_terminal(tty)
        os.close(master)
        assert transformers.utils.logging.is_progress_bar_enabled()
    finally:
        transformers.utils.logging.enable_progress_bar()


def test_a_bench_run_into_a_log_has_no_redraws_and_a_line_per_run(tmp_path):
    """End to end: bench on tiny local models with stderr going to a pipe, as in CI."""
    matrix = write_local_matrix(tmp_path)
    r = subprocess.run([sys.executable, "-m", "harness", "--matrix", str(matrix), "bench", "-k", "2", "--repeats", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "\r" not in r.stdout
    steps = [line for line in r.stderr.splitlines() if line.startswith("INFO harness.progress: bench tiny+draft: ")]
    assert steps and steps[-1].startswith(f"INFO harness.progress: bench tiny+draft: {len(steps)}/{len(steps)} run"), \
        r.stderr[-3000:]
