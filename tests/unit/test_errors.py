"""Every error of the suite is one of four kinds, by what the user does about it (harness/core/errors.py),
and the CLI exits with its kind's status."""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.cli.main import build_parser
from harness.core.errors import (
    KINDS,
    BadInputError,
    HarnessError,
    IntegrityError,
    MissingModelError,
    UnsupportedHereError,
)

HARNESS = Path(harness.__file__).parent
# programs, not modules: __main__ runs the CLI; the sandbox's stage programs run standard-library-only
# inside the sandbox (checked below), so they hold no HarnessError
NOT_IMPORTED = {"harness.__main__", "harness.sandbox.child", "harness.sandbox.jail"}
# defined in files being rewritten in parallel; each line goes when its class subclasses a kind
PENDING: set[str] = set()  # classes not yet under a kind
# files that still raise the base class itself (exit status 2, as bad input); each goes when it raises kinds
RAISE_BASE: set[str] = set()


def harness_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(HARNESS)], prefix="harness.")
                  if m.name not in NOT_IMPORTED)


def subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= subclasses(sub)
    return found


def error_classes() -> dict[str, type]:
    """Every HarnessError subclass that a module of harness/ defines (each module imported)."""
    for name in harness_modules():
        importlib.import_module(name)
    return {f"{c.__module__}.{c.__qualname__}": c for c in subclasses(HarnessError)
            if c.__module__.split(".")[0] == "harness" and c not in KINDS}


def defined_in_source(classes: dict[str, type]) -> set[str]:
    """The names of the classes that harness/'s source derives from HarnessError, a kind or one of `classes`, read
    from the source (a check on the walk, which finds only what it imported)."""
    errors = {"HarnessError", *(k.__name__ for k in KINDS), *(c.__name__ for c in classes.values())}
    return {node.name for path in HARNESS.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef) and {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases} & errors
            } - {k.__name__ for k in KINDS}


def test_the_kinds_have_their_own_status_and_say_what_to_do():
    statuses = [k.exit_status for k in KINDS]
    assert len(set(statuses)) == len(KINDS) and not set(statuses) & {0, 1, 130, 143}, statuses
    assert all(issubclass(k, HarnessError) and k.__bases__ == (HarnessError,) for k in KINDS)
    assert all(k.__doc__ and len(k.__doc__.split()) > 10 for k in KINDS)
    assert not [k.__name__ for k in KINDS if hasattr(builtins, k.__name__)]


def test_every_error_of_the_suite_is_one_kind():
    classes = error_classes()
    assert defined_in_source(classes) <= {c.__name__ for c in classes.values()}  # the walk imported them all
    kinds_of = {name: [k.__name__ for k in KINDS if issubclass(c, k)] for name, c in classes.items()}
    wrong = {name: kinds for name, kinds in kinds_of.items() if len(kinds) != 1 and name not in PENDING}
    assert not wrong, f"each error subclasses exactly one of {[k.__name__ for k in KINDS]}: {wrong}"
    done = {name for name in PENDING if kinds_of.get(name)}
    assert not done, f"{done} now has a kind: remove it from PENDING"


def test_the_stage_programs_left_out_of_the_walk_import_no_harness():
    for name in NOT_IMPORTED - {"harness.__main__"}:
        path = HARNESS.joinpath(*name.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.split(".")[0] == "harness"], (name, imported)


def test_only_files_under_rewrite_raise_the_base_class_itself():
    found = set()
    for path in HARNESS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "HarnessError"):
                found.add(str(path.relative_to(HARNESS.parent)))
    assert found <= RAISE_BASE, f"raise one of the kinds, not HarnessError itself: {sorted(found - RAISE_BASE)}"
    assert found == RAISE_BASE, f"{sorted(RAISE_BASE - found)} no longer raise HarnessError: remove from RAISE_BASE"


def test_the_help_lists_each_kinds_status():
    epilog = build_parser().format_help().split("exit status:")[1]
    for kind, words in ((BadInputError, "bad input"), (MissingModelError, "a model is not here"),
                        (UnsupportedHereError, "this machine cannot"), (IntegrityError, "stored data")):
        assert f"\n  {kind.exit_status}    {words}" in epilog, epilog


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.mark.parametrize("kind, args, message", [
    (BadInputError, ["bench", "--pair", "nope"], "error: Unknown pair 'nope'."),
    (BadInputError, ["bench", "-k", "0"], "every K must be within 1..64"),  # argparse's status: the same
    (MissingModelError, ["bench", "--pair", "smollm2-135m+self"], "model 'smollm2-135m-instruct' is not fetched"),
    (UnsupportedHereError, ["bench", "--attention", "flash_attention_2"], "needs a CUDA GPU"),
    (IntegrityError, ["history", "show", "--history", "{tmp}/junk.sqlite"], "not a history file"),
])
def test_the_cli_exits_with_the_status_of_the_kind(kind, args, message, tmp_path):
    (tmp_path / "junk.sqlite").write_text("not sqlite\n" * 100)
    r = cli(*[a.format(tmp=tmp_path) for a in args], env={"HARNESS_CACHE_DIR": str(tmp_path / "cache")})
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:") or ": error:" in line]
    assert r.returncode == kind.exit_status and len(errors) == 1 and message in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
