"""Where the suite keeps what it fetches and builds: models, quantized checkpoints, the sandbox's files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Absolute, so that a relative $HARNESS_CACHE_DIR means one folder whatever the working directory
    (the A/B gate's base arm runs in another one, and gets this path, not the variable's text)."""
    if env := os.environ.get("HARNESS_CACHE_DIR"):
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "assisted-bench"
