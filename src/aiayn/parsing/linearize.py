"""Trees as token sequences, after Vinyals, Kaiser et al. (2015), "Grammar as a Foreign Language".

The source is the sentence's words joined by spaces. The target is the tree read depth-first:
an opening bracket carries its label (``(NP``), so does the closing one (``)NP``), and every
preterminal, tag and word together, becomes the one token ``XX``. POS tags are not scored by
EVALB and the words are already on the source side, so as in the paper the model predicts only
the bracketing; ``delinearize`` puts the words (and, for scoring, the gold tags) back::

    (S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))
    ->  (S (NP XX XX )NP (VP XX )VP XX )S

``delinearize`` accepts any token sequence a model may emit and repairs it deterministically,
so every hypothesis can be scored (rules in its docstring).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from ..errors import UserError
from .trees import Leaf, Tree

__all__ = [
    "LEAF",
    "PLACEHOLDER_TAG",
    "Leaves",
    "linearize",
    "is_bracket",
    "index_token",
    "source_line",
    "source_text",
    "delinearize",
]

# What a preterminal becomes in the target: the paper's placeholder or (options, not the
# paper's) its word index, POS tag or word.
Leaves = Literal["XX", "index", "tags", "words"]

LEAF = "XX"
# The tag of a reconstructed preterminal when no tags are supplied.
PLACEHOLDER_TAG = "XX"
# The label of the root wrapped around output that is not a single constituent.
FALLBACK_ROOT = "S"


def index_token(i: int) -> str:
    """The marker of the i-th word (from 1) for ``leaves="index"``: ``<1>``, ``<2>``...
    (PTB writes no ``<`` or ``>`` in words)."""
    return f"<{i}>"


def linearize(tree: Tree, leaves: Leaves = "XX") -> list[str]:
    """The target tokens of ``tree``: ``(LABEL``, ``XX`` per preterminal, ``)LABEL``.

    The options give encoder-decoder attention the lexical anchor that translation has and
    ``XX`` targets lack (a 30-minute CPU model ignores the source otherwise: docs/parsing.md):

    * ``"index"``: the i-th preterminal is ``<i>``, and the source carries the same marker
      before the i-th word (``source_line``). Attention finds the word it is at by matching
      the marker it has just written, the way translation matches words; counting words,
      which softmax attention does badly, is no longer needed.
    * ``"tags"``: the POS tag (depends on the word, but does not say which word it is).
    * ``"words"``: the word itself (the decoder copies the source).
    """
    tokens: list[str] = []
    _brackets(tree, tokens)
    if leaves == "XX":
        return tokens
    values: Iterator[str]
    if leaves == "index":
        values = iter(index_token(i + 1) for i in range(len(tree.words())))
    else:
        values = iter(tree.tags() if leaves == "tags" else tree.words())
    return [tok if tok != LEAF else next(values) for tok in tokens]


def _brackets(tree: Tree, out: list[str]) -> None:
    out.append(f"({tree.label}")
    for child in tree.children:
        if isinstance(child, Leaf):
            out.append(LEAF)
        else:
            _brackets(child, out)
    out.append(f"){tree.label}")


def is_bracket(token: str) -> bool:
    """``(LABEL``, ``)LABEL`` or ``)`` (a word never is one: PTB writes brackets -LRB-/-RRB-)."""
    return (token[:1] == "(" and len(token) > 1) or token[:1] == ")"


def source_line(words: Sequence[str], leaves: Leaves = "XX") -> str:
    """The source side: the words joined by single spaces, each after its ``index_token``
    with ``leaves="index"``."""
    if leaves == "index":
        return " ".join(f"{index_token(i + 1)} {word}" for i, word in enumerate(words))
    return " ".join(words)


def source_text(tree: Tree, leaves: Leaves = "XX") -> str:
    """The source side of ``tree`` (``source_line`` of its words)."""
    return source_line(tree.words(), leaves)


# A subtree being rebuilt: [label, children]; a leaf is the LEAF string until words go in.
_Node = list


def _parse(tokens: Sequence[str]) -> tuple[list, bool]:
    """Bracket structure of ``tokens`` as nested [label, children] lists under a virtual root.

    Returns (top-level items, repaired). Implements repair rules 1-4 of ``delinearize``.
    """
    repaired = False
    root: _Node = [None, []]
    stack: list[_Node] = [root]
    for tok in tokens:
        if tok == LEAF:
            stack[-1][1].append(LEAF)
        elif tok.startswith("(") and len(tok) > 1:
            node: _Node = [tok[1:], []]
            stack[-1][1].append(node)
            stack.append(node)
        elif tok.startswith(")"):
            if len(stack) == 1:
                repaired = True  # rule 2: nothing is open
                continue
            node = stack.pop()
            repaired |= tok not in (")", f"){node[0]}")  # rule 2: label mismatch
        else:
            repaired = True  # rule 1: unknown token
    repaired |= len(stack) > 1  # rule 3: brackets left open are closed at the end
    return root[1], repaired


def _prune(items: list) -> list:
    """Drop constituents with no leaves, recursively (rule 4)."""
    out = []
    for item in items:
        if item == LEAF:
            out.append(item)
        else:
            children = _prune(item[1])
            if children:
                out.append([item[0], children])
    return out


def _count_leaves(items: list) -> int:
    return sum(1 if item == LEAF else _count_leaves(item[1]) for item in items)


def _truncate(items: list, keep: int) -> tuple[list, int]:
    """Keep the first ``keep`` leaves in order; returns (items, leaves still to keep)."""
    out = []
    for item in items:
        if keep == 0:
            break
        if item == LEAF:
            out.append(item)
            keep -= 1
        else:
            children, keep_after = _truncate(item[1], keep)
            out.append([item[0], children])
            keep = keep_after
    return out, keep


def _build(node: _Node, words: Sequence[str], tags: Sequence[str], i: list[int]) -> Tree:
    """Turn [label, children] into a Tree, filling leaves with words and tags in order."""
    children: list[Tree | Leaf] = []
    for item in node[1]:
        if item == LEAF:
            children.append(Leaf(tags[i[0]], words[i[0]]))
            i[0] += 1
        else:
            children.append(_build(item, words, tags, i))
    return Tree(node[0], tuple(children))


def delinearize(
    tokens: Sequence[str],
    words: Sequence[str],
    tags: Sequence[str] | None = None,
    leaves: Leaves = "XX",
) -> tuple[Tree, bool]:
    """Rebuild a Tree from a model's target ``tokens`` and the source ``words``.

    ``tags`` fill the preterminals (default ``XX``). To score with EVALB pass the gold tags:
    EVALB removes punctuation by its tag, so test trees need the gold tags to line up with
    the gold trees; the paper does not score tags either. With ``leaves="tags"`` and no
    ``tags`` the model's own tags are used (``XX`` for leaves that repair added).

    Ill-formed output is repaired, deterministically, and ``repaired`` is True:

    1. A token that is neither ``XX``, ``(LABEL`` nor ``)`` / ``)LABEL`` is dropped.
    2. A closing bracket closes the innermost open bracket whatever its label (the opening
       label wins); one with nothing open is dropped.
    3. Brackets still open at the end are closed there.
    4. Constituents with no ``XX`` inside are dropped.
    5. Too many ``XX``: the surplus at the end is cut, then rule 4 again. Too few: the
       missing leaves are appended as the last children of the root.
    6. If what remains is not one constituent (several, a bare ``XX``, or nothing), it is
       wrapped in an ``S`` root.

    Well-formed output (matching labels, one root, as many ``XX`` as words) is returned
    unchanged with ``repaired`` False, so ``delinearize(linearize(t), t.words(), t.tags())``
    is ``t``. With the other ``leaves`` every token that is not a bracket is a leaf (an ``XX``);
    the leaves still take the source ``words`` in order, whatever the model wrote.
    """
    if not words:
        raise UserError("cannot build a tree over no words")
    if tags is None and leaves == "tags":
        # Leaves keep their order through repair (surplus is cut at the end, missing ones are
        # appended), so the i-th leaf token is the i-th word's tag.
        predicted = [tok for tok in tokens if not is_bracket(tok)][: len(words)]
        tags = predicted + [PLACEHOLDER_TAG] * (len(words) - len(predicted))
    if tags is None:
        tags = [PLACEHOLDER_TAG] * len(words)
    if len(tags) != len(words):
        raise UserError(f"{len(tags)} tags for {len(words)} words")
    if leaves != "XX":
        tokens = [tok if is_bracket(tok) else LEAF for tok in tokens]
    items, repaired = _parse(tokens)
    pruned = _prune(items)
    repaired |= pruned != items
    n_leaves = _count_leaves(pruned)
    if n_leaves > len(words):
        pruned = _prune(_truncate(pruned, len(words))[0])
    if len(pruned) == 1 and pruned[0] != LEAF:
        root = pruned[0]
    else:
        root = [FALLBACK_ROOT, pruned]
        repaired = True
    if n_leaves < len(words):
        root[1].extend([LEAF] * (len(words) - n_leaves))
    repaired |= n_leaves != len(words)
    return _build(root, words, tags, [0]), repaired
