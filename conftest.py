"""The perf gate's pytest plugin (harness/perf/plugin.py) is registered by the package's pytest11
entry point (pyproject.toml), so its options exist wherever pytest starts. From a checkout that is
not installed (no entry point), register it here instead."""

from importlib.metadata import entry_points

if not any(ep.value == "harness.perf.plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["harness.perf.plugin"]
