"""The README and the documentation pages: a newcomer's screen, and no page lost.

The README opens with one sentence of what aiayn is and the two commands a fresh machine needs
(CI runs the second one), stays short (a front page: its tables rendered from records, no dated
prose), and links only to what exists; no docs page has a dated heading (the history is git's); every page under docs/ is in the nav of mkdocs.yml, so the
site shows it. ``make docs`` (part of ``make test``) runs ``mkdocs build --strict``, which checks
the links and anchors inside docs/.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 120
MAX_README_BYTES = 8 * 1024
MAX_CELL = 200  # characters in one table cell of the README
DATE = re.compile(
    r"\b20\d\d-\d\d(-\d\d)?\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b"
)
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")

# a repository lint: `make lint` runs it (pytest -m lint), the main run of `make test` does not
pytestmark = pytest.mark.lint


def fenced_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line index of the opening fence, the block's lines) of every fenced code block."""
    blocks, current, start = [], None, 0
    for i, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            if current is None:
                current, start = [], i
            else:
                blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(lines: list[str]) -> list[str]:
    """The shell commands of a block's lines, comments and blank lines dropped."""
    return [
        shlex.join(shlex.split(line, comments=True)) for line in lines if line.split("#")[0].strip()
    ]


def readme_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    start, lines = fenced_blocks(text)[0]
    before = [line for line in text.splitlines()[:start] if line.strip()]
    assert len(before) == 2 and before[0].startswith("# "), "the title, one sentence, the commands"
    sentence = before[1]
    one = sentence.endswith(".") and not re.search(r"[.!?] [A-Z]", sentence)
    assert one, f"one sentence: {sentence!r}"
    return commands(lines)


def test_readme_opens_with_the_demo_and_the_test_command():
    assert readme_commands() == ["make demo", "make test"]


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert readme_commands()[1] in commands(ci)


def test_readme_fits_a_screen_or_two():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_README_LINES, f"README.md has {len(lines)} lines"
    size = README.stat().st_size
    assert size < MAX_README_BYTES, f"README.md has {size} bytes"


def prose_and_cells(text: str) -> tuple[list[str], list[str]]:
    """The lines outside code blocks and tables, and the cells of the tables."""
    inside = {
        i for start, lines in fenced_blocks(text) for i in range(start, start + len(lines) + 2)
    }
    prose, cells = [], []
    for i, line in enumerate(text.splitlines()):
        if i in inside:
            continue
        if line.startswith("|"):
            cells.extend(cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|")))
        else:
            prose.append(line)
    return prose, cells


def test_readme_table_cells_are_short():
    _, cells = prose_and_cells(README.read_text(encoding="utf-8"))
    assert cells, "the README has its results table"
    long = [cell for cell in cells if len(cell) > MAX_CELL]
    assert not long, f"README.md: a table cell over {MAX_CELL} characters: {long[0][:80]}..."


def test_readme_prose_holds_no_date():
    prose, _ = prose_and_cells(README.read_text(encoding="utf-8"))
    dated = [line for line in prose if DATE.search(line)]
    assert not dated, f"README.md: a date in prose (dates belong to records/): {dated[0]}"


def test_no_docs_page_has_a_dated_heading():
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        inside = {
            i for start, lines in fenced_blocks(text) for i in range(start, start + len(lines) + 2)
        }
        for i, line in enumerate(text.splitlines()):
            if line.startswith("#") and i not in inside and DATE.search(line):
                raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a dated heading: {line}")


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    inside = {
        i for start, lines in fenced_blocks(text) for i in range(start, start + len(lines) + 2)
    }
    return {
        slug(line.lstrip("#"))
        for i, line in enumerate(text.splitlines())
        if line.startswith("#") and i not in inside
    }


def test_the_readmes_links_reach_files_and_headings_that_exist():
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to the docs"
    for target in local:
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else README
        assert page.is_file(), f"README.md links to a missing {path}"
        if anchor and page.suffix == ".md":
            assert anchor in anchors(page), f"README.md links to a missing {target}"


def nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True
    listed = nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(listed)) == pages, "docs/ pages and the nav of mkdocs.yml differ"
    assert len(listed) == len(set(listed)), "a page is listed twice"
