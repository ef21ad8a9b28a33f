"""Every relative link in the README and docs/ reaches a file of the repository and, where it names a
section (`file.md#anchor`), a heading of that file; and every pointer from the code or a doc to a
section by its title (`docs/perf-gate.md, "The statistics"`) names a file there and the start of one
of its headings: a doc moved or a heading renamed breaks no reader's link or pointer silently."""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE = [*(p for room in ("harness", "benchmarks", "quant", "tests") for p in sorted((REPO / room).rglob("*.py"))
          if p != Path(__file__).resolve()), REPO / "conftest.py", REPO / "Makefile"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
# `docs/perf-gate.md, "The statistics"` (in a doc also `perf-gate.md, "The statistics"`), the title
# possibly broken over lines of a comment or docstring
POINTER = re.compile(r'((?:docs/)?[\w-]+\.md),? "([^"]+)"')


def headings(markdown: str) -> list[str]:
    """A markdown text's headings as written, outside fenced code."""
    return HEADING.findall(FENCE.sub("", markdown))


def anchors(titles: Iterable[str]) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered from -1."""
    seen: dict[str, int] = {}
    out = set()
    for heading in titles:
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@functools.cache
def headings_of(file: Path) -> tuple[str, ...]:
    """A file's headings as written, read and parsed once however many links and pointers reach it."""
    return tuple(headings(file.read_text()))


@functools.cache
def anchors_of(file: Path) -> frozenset[str]:
    return frozenset(anchors(headings_of(file)))


@functools.cache
def titles_of(file: Path) -> tuple[str, ...]:
    """A file's headings, backticks dropped: what a pointer's title is read against."""
    return tuple(h.replace("`", "").strip() for h in headings_of(file))


def pointers(text: str, comments: bool = True) -> list[tuple[str, str]]:
    """Each (file, title) a text points to: line breaks inside a title, and in code (`comments`) the
    comment markers that start its lines, read as a space."""
    flat = re.sub(r"\s+", " ", re.sub(r"\n[ \t]*#+[ \t]?", " ", text) if comments else text)
    return [(file, " ".join(title.replace("`", "").split())) for file, title in POINTER.findall(flat)]


def broken_pointers(source: Path) -> list[str]:
    """The pointers of `source` whose file is neither at the top of the repository (`README.md`,
    `docs/ci.md`) nor in docs/ (`ci.md`), or whose title starts none of that file's headings."""
    markdown = source.suffix == ".md"
    text = FENCE.sub("", source.read_text()) if markdown else source.read_text()
    broken = []
    for name, title in pointers(text, comments=not markdown):
        file = REPO / name if (REPO / name).exists() else REPO / "docs" / name
        if not file.exists():
            broken.append(f"{name}: no such file")
        elif not any(heading.startswith(title) for heading in titles_of(file)):
            broken.append(f'{name}, "{title}": no heading of {file.name} starts so')
    return broken


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
        elif anchor and file.suffix == ".md" and anchor not in anchors_of(file):
            broken.append(f"{target}: no heading of {file.name} makes #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("source", CODE + DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_pointer_to_a_section_names_one_of_its_headings(source):
    broken = broken_pointers(source)
    assert not broken, f"{source.relative_to(REPO)}: " + "; ".join(broken)


def test_a_pointer_may_break_over_comment_lines():
    text = '# see docs/perf-gate.md, "Which phase keeps\n    # the gate looking"; and (docs/ci.md "CI")\n'
    assert pointers(text) == [("docs/perf-gate.md", "Which phase keeps the gate looking"), ("docs/ci.md", "CI")]


def test_the_anchor_rule_is_githubs():
    text = "# The merge gate's cap\n## Side by side (duet)\n### `amx`: Intel Xeon\n## A round\n## A round\n"
    assert anchors(headings(text)) == {"the-merge-gates-cap", "side-by-side-duet", "amx-intel-xeon", "a-round", "a-round-1"}
