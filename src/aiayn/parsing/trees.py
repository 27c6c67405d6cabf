"""Penn Treebank trees: a small immutable type, readers, the standard preprocessing, a writer.

Two layouts are read by the same tokenizer: the treebank's ``.mrg`` files (several
multi-line trees per file, each wrapped in an outer unlabelled ``( ... )``) and the
one-tree-per-line bracketed files that parsers and EVALB use. Errors name the file and line.

The preprocessing is the one every WSJ parsing paper uses (and EVALB assumes): function tags
and co-indices are stripped (``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP``) while labels
that *begin* with a dash (``-NONE-``, ``-LRB-``, ``-RRB-``) are kept whole; ``-NONE-`` empty
elements are removed together with every constituent left empty; the outer unlabelled (or
``TOP``/``ROOT``) bracket is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..files import iter_lines, write_lines_atomic

__all__ = [
    "Leaf",
    "Tree",
    "TreeSyntaxError",
    "parse_trees",
    "read_mrg",
    "read_tree_lines",
    "read_treebank",
    "strip_label",
    "preprocess",
    "to_bracketed",
    "write_tree_lines",
]

# Labels of the outer bracket that carries no constituent of its own.
ROOT_LABELS = frozenset({"", "TOP", "ROOT"})
EMPTY_ELEMENT = "-NONE-"


@dataclass(frozen=True)
class Leaf:
    """A preterminal: a part-of-speech tag over one word, written ``(tag word)``."""

    tag: str
    word: str


@dataclass(frozen=True)
class Tree:
    """A labelled constituent. Frozen so trees compare by value and can be hashed."""

    label: str
    children: tuple[Tree | Leaf, ...]

    def leaves(self) -> list[Leaf]:
        """The preterminals, left to right."""
        out: list[Leaf] = []
        for child in self.children:
            if isinstance(child, Leaf):
                out.append(child)
            else:
                out.extend(child.leaves())
        return out

    def words(self) -> list[str]:
        return [leaf.word for leaf in self.leaves()]

    def tags(self) -> list[str]:
        return [leaf.tag for leaf in self.leaves()]


class TreeSyntaxError(UserError):
    """A malformed bracketing; the message starts with ``source:line:``."""


# A whole preterminal "(tag word)" is one match (group 1, 2): it is most of the text, and
# matching it at once keeps reading the WSJ sample well under a second.
_TOKEN = re.compile(r"\(([^\s()]+)\s+([^\s()]+)\s*\)|\(|\)|[^\s()]+")


def _line(text: str, pos: int) -> int:
    """1-based line of a character offset; computed only for error messages."""
    return text.count("\n", 0, pos) + 1


@dataclass
class _Frame:
    """An open bracket while parsing; the label stays None until its token is read."""

    pos: int
    label: str | None = None
    children: list[Tree | Leaf] = field(default_factory=list)


def parse_trees(text: str, source: str = "<string>") -> list[Tree]:
    """Parse every bracketed tree in ``text``, whatever its layout; no preprocessing.

    A node is ``(label child ...)``; ``(tag word)`` is a Leaf. The outer bracket of an
    ``.mrg`` tree has no label and is kept as ``Tree("", ...)`` until ``preprocess``.
    """

    def error(pos: int, message: str) -> TreeSyntaxError:
        return TreeSyntaxError(f"{source}:{_line(text, pos)}: {message}")

    trees: list[Tree] = []
    stack: list[_Frame] = []
    for m in _TOKEN.finditer(text):
        tok, pos = m.group(), m.start()
        if m.group(1) is not None:
            if not stack:
                raise error(pos, f"a lone preterminal {tok!r} is not a tree")
            if stack[-1].label is None:
                stack[-1].label = ""  # a bracket opening straight onto a child is unlabelled
            stack[-1].children.append(Leaf(m.group(1), m.group(2)))
        elif tok == "(":
            if stack and stack[-1].label is None:
                stack[-1].label = ""
            stack.append(_Frame(pos))
        elif tok == ")":
            if not stack:
                raise error(pos, "unmatched ')'")
            frame = stack.pop()
            if not frame.children:
                raise error(frame.pos, f"constituent ({frame.label or ''} has no children")
            node = Tree(frame.label or "", tuple(frame.children))
            if stack:
                stack[-1].children.append(node)
            else:
                trees.append(node)
        elif not stack:
            raise error(pos, f"{tok!r} outside any bracket")
        elif stack[-1].label is None:
            stack[-1].label = tok
        else:
            raise error(
                pos, f"{tok!r}: a word must be the only child of its preterminal ({stack[-1].label}"
            )
    if stack:
        raise error(stack[0].pos, "unclosed '(' at end of input")
    return trees


def read_mrg(path: str | Path) -> list[Tree]:
    """All trees of one ``.mrg`` file, raw (see ``preprocess``)."""
    path = Path(path)
    return parse_trees(path.read_text(encoding="utf-8"), source=str(path))


def read_tree_lines(path: str | Path) -> list[Tree | None]:
    """A one-tree-per-line file, raw. A blank line is ``None``: a parser's failed sentence,
    which EVALB counts as skipped, so it must keep its place."""
    out: list[Tree | None] = []
    for lineno, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            out.append(None)
            continue
        trees = parse_trees(line, source=f"{path}:{lineno}")
        if len(trees) != 1:
            raise TreeSyntaxError(f"{path}:{lineno}: expected one tree, found {len(trees)}")
        out.append(trees[0])
    return out


def read_treebank(paths: Iterable[str | Path]) -> list[Tree]:
    """Read and ``preprocess`` every tree of the given ``.mrg`` files, in order."""
    return [preprocess(tree) for path in paths for tree in read_mrg(path)]


def strip_label(label: str) -> str:
    """Drop function tags and indices: ``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP``.

    Labels that begin with a dash are names, not tagged labels: ``-NONE-``, ``-LRB-``.
    """
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


def _clean(node: Tree | Leaf) -> Tree | Leaf | None:
    """Strip labels and remove empty elements; None when nothing is left."""
    if isinstance(node, Leaf):
        return None if node.tag == EMPTY_ELEMENT else Leaf(strip_label(node.tag), node.word)
    kept = tuple(c for c in (_clean(child) for child in node.children) if c is not None)
    return Tree(strip_label(node.label), kept) if kept else None


def preprocess(tree: Tree) -> Tree:
    """The standard WSJ preprocessing (module docstring). The result's root is the first
    real constituent (usually ``S``). An outer bracket over several children, or over a
    lone preterminal, is kept and labelled ``TOP`` (which EVALB deletes)."""
    cleaned = _clean(tree)
    if not isinstance(cleaned, Tree):
        raise UserError(f"tree has no words once empty elements are removed: {to_bracketed(tree)}")
    if cleaned.label in ROOT_LABELS or tree.label in ROOT_LABELS:
        if len(cleaned.children) == 1 and isinstance(cleaned.children[0], Tree):
            return cleaned.children[0]
        return Tree("TOP", cleaned.children)
    return cleaned


def to_bracketed(node: Tree | Leaf) -> str:
    """One-line bracketed form: ``(S (NP (DT the) (NN dog)) (VP (VBZ barks)))``."""
    if isinstance(node, Leaf):
        return f"({node.tag} {node.word})"
    return f"({node.label} {' '.join(to_bracketed(child) for child in node.children)})"


def write_tree_lines(trees: Iterable[Tree | None], path: str | Path) -> None:
    """One tree per line, the format EVALB reads; ``None`` becomes a blank line."""
    write_lines_atomic(path, ("" if tree is None else to_bracketed(tree) for tree in trees))
