"""The perf gate (`pytest -m perf`): combinations of the matrix, interleaved rounds, the
statistics that turn rounds into PASS / FAIL / UNDECIDED, per-platform baselines, reports, and
the pytest plugin that wires them in (plugin.py). May import: harness.core.
"""
