"""Every relative link in the README and docs/ reaches a file of the repository and, where it names a
section (`file.md#anchor`), a heading of that file: a doc moved or a heading renamed breaks no reader's
link silently."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered from -1."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@functools.cache
def headings_of(file: Path) -> frozenset[str]:
    """A file's anchors, read and parsed once however many links point into it."""
    return frozenset(anchors(file.read_text()))


def links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", doc.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_its_file_and_heading(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif anchor and file.suffix == ".md" and anchor not in headings_of(file):
            broken.append(f"{target}: no heading of {file.name} makes #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def test_the_anchor_rule_is_githubs():
    text = "# The merge gate's cap\n## Side by side (duet)\n### `amx`: Intel Xeon\n## A round\n## A round\n"
    assert anchors(text) == {"the-merge-gates-cap", "side-by-side-duet", "amx-intel-xeon", "a-round", "a-round-1"}
