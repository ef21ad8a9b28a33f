"""Registers the perf gate's pytest plugin (all its options and hooks: harness/plugin.py)."""

pytest_plugins = ["harness.plugin"]
