"""Shared by the accuracy tests: the combinations, model loading with a clear skip, result files."""

from __future__ import annotations

import json
import os
from functools import cache, lru_cache
from pathlib import Path

import pytest

from harness.core import models, registry
from harness.core.errors import HarnessError

RESULTS = Path(os.environ.get("HARNESS_ACCURACY_RESULTS", "results/accuracy"))


@cache
def matrix() -> registry.Matrix:
    return registry.load_matrix()


@lru_cache(maxsize=2)  # the current pair's target and draft; earlier models are released (24 GiB here)
def load(name: str, precision: str) -> models.LoadedModel:
    try:
        return models.load(matrix().model(name), precision)
    except HarnessError as exc:  # not fetched, no hub: say what to run
        pytest.skip(str(exc))


def save(name: str, doc: dict) -> Path:
    from harness.core.jsonio import atomic_write_text

    path = RESULTS / f"{name}.json"
    atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return path
