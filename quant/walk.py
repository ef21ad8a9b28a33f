"""Finding the linear layers a method converts, and swapping a converted one in."""

from __future__ import annotations

import fnmatch

from torch import nn


def linear_layers(model: nn.Module, skip: tuple[str, ...] = ()) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear by qualified name, except names matching a `skip` glob ('lm_head', '*.mlp.*')."""
    return [(name, m) for name, m in model.named_modules()
            if type(m) is nn.Linear and not any(fnmatch.fnmatch(name, pat) for pat in skip)]


def convert_all(model: nn.Module, skip: tuple[str, ...], make) -> int:
    """Swap `make(linear)` in for every linear layer not skipped; the number converted."""
    layers = linear_layers(model, tuple(skip))
    for name, lin in layers:
        replace(model, name, make(lin))
    return len(layers)


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
