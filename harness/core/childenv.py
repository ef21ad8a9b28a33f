"""The import path of a child Python process that must import a given tree first."""

from __future__ import annotations

import os
from pathlib import Path


def python_path(*first: Path | str, inherit: bool = True) -> str:
    """PYTHONPATH for a child: the folders `first`, in order, then (with `inherit`) this process's
    own PYTHONPATH, so that packages installed there (`pip install --target DIR`, a read-only
    image's extra folder) still import. A child of another Python environment must not inherit it:
    its own packages have to win over this environment's."""
    parts = [str(p) for p in first]
    if inherit:
        parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)
