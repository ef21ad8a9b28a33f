"""A child Python process's import path: the tree it must import first, then what this process was given."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.core.childenv import python_path


def test_the_tree_comes_first_then_the_inherited_path_without_repeats(monkeypatch, tmp_path):
    extra, tree = tmp_path / "site", tmp_path / "tree"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(extra), "", str(tree)]))
    assert python_path(tree) == os.pathsep.join([str(tree), str(extra)])
    assert python_path(tree, inherit=False) == str(tree)


def test_without_an_inherited_path_only_the_tree(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert python_path(tmp_path, "other") == os.pathsep.join([str(tmp_path), "other"])


def test_a_child_imports_a_package_installed_with_pip_target(monkeypatch, tmp_path):
    """Packages installed into a folder on PYTHONPATH (pip install --target, as on an image whose
    site-packages are read-only) still import in a child that puts its tree first."""
    site, tree = tmp_path / "site", tmp_path / "tree"
    (site / "only_in_site").mkdir(parents=True)
    (site / "only_in_site" / "__init__.py").write_text("WHERE = 'site'\n")
    (tree / "only_in_tree").mkdir(parents=True)
    (tree / "only_in_tree" / "__init__.py").write_text("WHERE = 'tree'\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    code = "import only_in_site, only_in_tree; print(only_in_site.WHERE, only_in_tree.WHERE)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": python_path(tree)})
    assert r.returncode == 0 and r.stdout.split() == ["site", "tree"], r.stderr
