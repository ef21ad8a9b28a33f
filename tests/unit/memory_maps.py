"""Where a tensor's memory lies: in which file's mapping of this process (/proc/self/maps)."""

from __future__ import annotations

from pathlib import Path

import torch


def mappings_of(path: Path) -> list[tuple[int, int]]:
    """The address ranges at which this process maps the file at `path`."""
    return [tuple(int(a, 16) for a in line.split()[0].split("-"))
            for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(str(path))]


def in_mapping_of(tensor: torch.Tensor, path: Path) -> bool:
    """True when `tensor`'s data lies in a mapping of the file at `path` (not a copy of it)."""
    return any(start <= tensor.data_ptr() < end for start, end in mappings_of(path))
