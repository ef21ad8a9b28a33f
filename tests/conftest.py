"""Loaded for every test folder: each pytest-xdist worker on its own core (tests/pinning.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pinning  # noqa: E402

pytest_configure = pinning.pytest_configure
