"""Markup and placeholders through a translation (``--markup``, ``--placeholders``): taken out
of the text before it is encoded, put back into the translation.

Taken out, not replaced by sentinel tokens for the model to copy: what never goes through the
model comes back verbatim in every output, however small or untrained the model (a model
copies most sentinels, not all). Where each goes is the model's own view: the encoder-decoder
alignments (``aiayn.decode.align``) map the source words around it to target words. A
placeholder or self-closing tag goes after the target word aligned to the source word before
it; a pair of tags wraps the target words aligned to the words it wrapped (from the first to
the last of them). An engine without attention (CTranslate2) places them proportionally.

Well formed by construction: the tags form a tree as in the source, each element's target
span is kept inside its parent's and apart from its siblings', and the model's words are
escaped (``&``, ``<``, ``>``) under ``--markup``. A tag without its pair is kept as a
placeholder. ``well_formed`` checks an output with the standard library's parsers.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from xml.sax.saxutils import escape

from .placeholders import Placeholders

VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)  # HTML elements without a closing tag


RAW_TEXT = frozenset({"script", "style"})  # HTML elements whose contents are code, not text


@dataclass
class Leaf:
    """A placeholder or self-closing tag, at character ``at`` of the plain text; ``touches``:
    whether the source had no space on its left and on its right (``{count}items``,
    ``{first}{last}``): the output keeps those sides glued."""

    text: str
    at: int
    touches: tuple[bool, bool] = (False, False)


@dataclass
class Element:
    """A pair of tags around characters [start, end) of the plain text; each tag ``glued``
    to the thing taken out before it or not, as ``Leaf``'s."""

    open: str
    close: str = ""
    start: int = 0
    end: int = 0
    children: list[Leaf | Element] = field(default_factory=list)
    open_glued: bool = False
    close_glued: bool = False


@dataclass
class Marked:
    """A string taken apart: its words for the model, and what goes back around them."""

    plain: str  # the text without tags and placeholders, spaces as they were
    root: Element  # the tree of tags and placeholders, offsets into ``plain``
    lead: str  # the string's own leading and trailing spaces
    trail: str
    unpaired: list[str] = field(default_factory=list)  # tags without their pair: malformed

    @property
    def words(self) -> list[re.Match[str]]:
        return list(re.finditer(r"\S+", self.plain))

    @property
    def source(self) -> str:
        """What the model translates: the words, one space apart."""
        return " ".join(m.group() for m in self.words)


def _name(tag: str) -> str:
    named = re.match(r"</?([\w:.-]+)", tag)
    assert named is not None  # a tag the tokenizer matched starts with its name
    return named.group(1).lower()


def _touches(body: str, end: int) -> bool:
    """Whether the thing taken out of ``body`` up to ``end`` has no space after it."""
    return end < len(body) and not body[end].isspace()


def _glued(plain: list[str], body: str, at: int) -> bool:
    """Whether a thing taken out stood between two words with no space."""
    before = next((p for p in reversed(plain) if p), "")
    return bool(before) and not before[-1].isspace() and at < len(body) and not body[at].isspace()


def _raw_text_end(body: str, tag: str, at: int) -> int:
    """Where an HTML raw-text element (``<script>``, ``<style>``) opened by ``tag`` ends: after
    its close tag, else at the string's end (as a browser reads it)."""
    close = re.compile(rf"</{_name(tag)}\s*>", re.IGNORECASE).search(body, at)
    return close.end() if close else len(body)


def take_apart(text: str, pattern: Placeholders, html: bool = False) -> Marked:
    """``text`` as plain text and a tree of what ``pattern`` matched (kind "tag": tags,
    paired by name; "ph": placeholders). ``html``: void elements need no close, and a
    ``<script>`` or ``<style>`` element is kept whole, its code not translated."""
    body = text.strip()
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
    root, unpaired = Element(""), []
    stack, plain, at = [root], [], -1
    for kind, m in pattern.scan(body):
        if m.start() < at:
            continue  # inside a raw-text element taken whole
        end, tag = m.end(), m.group()
        leaf = kind != "tag" or tag.endswith("/>") or tag[1] in "!?"
        leaf = leaf or (html and _name(tag) in VOID and not tag.startswith("</"))
        if html and not leaf and not tag.startswith("</") and _name(tag) in RAW_TEXT:
            end = _raw_text_end(body, tag, end)
            tag, leaf = body[m.start() : end], True
        glued = m.start() == at  # right after the thing taken out before it
        touches = (m.start() > 0 and not body[m.start() - 1].isspace(), _touches(body, end))
        plain.append(body[max(at, 0) : m.start()])
        at, here = end, sum(map(len, plain))
        if leaf:
            stack[-1].children.append(Leaf(tag, here, touches))
            if _glued(plain, body, at):  # "one<br>two": still two words
                plain.append(" ")
        elif not tag.startswith("</"):
            stack.append(Element(tag, start=here, open_glued=glued))
        elif len(stack) > 1 and _name(stack[-1].open) == _name(tag):
            element = stack.pop()
            element.close, element.end, element.close_glued = tag, here, glued
            stack[-1].children.append(element)
        else:  # a close without its open: kept, as a placeholder
            stack[-1].children.append(Leaf(tag, here, touches))
            unpaired.append(tag)
    plain.append(body[max(at, 0) :])
    while len(stack) > 1:  # an open without its close: a placeholder, its contents lifted
        element = stack.pop()
        stack[-1].children += [Leaf(element.open, element.start, (element.open_glued, False))]
        stack[-1].children += element.children
        unpaired.append(element.open)
    root.end = sum(map(len, plain))
    return Marked("".join(plain), root, lead, trail, unpaired)


@dataclass
class _Projection:
    """Source words -> target words, from (source word, target word) alignment pairs."""

    to_target: list[list[int]]
    n_target: int

    @classmethod
    def of(cls, pairs: list[tuple[int, int]], n_source: int, n_target: int) -> _Projection:
        to_target: list[list[int]] = [[] for _ in range(n_source)]
        for i, j in pairs:
            if i < n_source and j < n_target:
                to_target[i].append(j)
        return cls(to_target, n_target)

    def point(self, p: int) -> int:
        """Where a thing before source word p goes: after the target word aligned to the
        nearest word before p, else before the one aligned to the nearest after."""
        for i in range(min(p, len(self.to_target)) - 1, -1, -1):
            if self.to_target[i]:
                return max(self.to_target[i]) + 1
        for i in range(p, len(self.to_target)):
            if self.to_target[i]:
                return min(self.to_target[i])
        return self.n_target if p > 0 else 0

    def span(self, a: int, b: int) -> tuple[int, int]:
        """The target words aligned to source words [a, b), first to last."""
        found = [j for i in range(a, b) for j in self.to_target[i]]
        if not found:
            return (self.point(a),) * 2
        return min(found), max(found) + 1


def proportional(n_source: int, n_target: int) -> list[tuple[int, int]]:
    """Alignment pairs by position alone (an engine without attention)."""
    return [(j * n_source // n_target, j) for j in range(n_target)] if n_source else []


def put_back(marked: Marked, translation: str, pairs: list[tuple[int, int]], markup: bool) -> str:
    """The translation of ``marked.source`` with its tags and placeholders put back where
    ``pairs`` (source word, target word) take them; the model's words escaped under
    ``markup``."""
    starts = [m.start() for m in marked.words]
    ends = [m.end() for m in marked.words]
    words = translation.split()
    proj = _Projection.of(pairs, len(starts), len(words))

    def word_at(c: int) -> int:  # the words that start before character c
        return sum(s < c for s in starts)

    def place(node: Leaf | Element) -> tuple[int, int]:
        if isinstance(node, Leaf):
            return (proj.point(word_at(node.at)),) * 2
        return proj.span(sum(e <= node.start for e in ends), word_at(node.end))

    items: list[Item] = []
    _render(marked.root, (0, len(words)), place, words, items, markup)
    return marked.lead + _join(items) + marked.trail


# kind ("w", "leaf", "open", "close"), text, and whether it is glued on its left and right
Item = tuple[str, str, bool, bool]


def _render(
    node: Element,
    span: tuple[int, int],
    place: Callable[[Leaf | Element], tuple[int, int]],
    words: list[str],
    items: list[Item],
    markup: bool,
) -> None:
    """Append ``node``'s items: its target words [span) with its children inside, each
    child's span clamped into it and after the siblings before it."""
    lo, hi = span
    placed = sorted(
        (
            (max(lo, min(s, hi)), max(lo, min(e, hi)), k)
            for k, (s, e) in enumerate(map(place, node.children))
        ),
        key=lambda x: (x[0], x[2]),
    )
    at = lo
    for s, e, k in placed:
        child = node.children[k]
        s = max(s, at)
        items += [("w", escape(w) if markup else w, False, False) for w in words[at:s]]
        if isinstance(child, Leaf):
            items.append(("leaf", child.text, *child.touches))
            at = s
            continue
        e = max(e, s)
        items.append(("open", child.open, child.open_glued, False))
        _render(child, (s, e), place, words, items, markup)
        items.append(("close", child.close, child.close_glued, False))
        at = e
    items += [("w", escape(w) if markup else w, False, False) for w in words[at:hi]]


def _join(items: list[Item]) -> str:
    """Items with a space between two that stand apart (an open tag sticks to what follows
    it, a close tag to what precedes it), except where the source had none: a placeholder
    keeps the sides it touched glued (``{count}items``, ``one<br>two``), and two tags that
    stood together stay together (``</b><i>``), not glued to a word they never touched."""
    out, before, right = [], None, False
    for kind, text, left, next_right in items:
        apart = before in ("w", "leaf", "close") and kind in ("w", "leaf", "open")
        glued = (left and (kind == "leaf" or before != "w")) or (right and kind == "w")
        if apart and not glued:
            out.append(" ")
        out.append(text)
        before, right = kind, next_right
    return "".join(out)


class _HTMLCheck(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.broken = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()
        elif tag not in VOID:
            self.broken = True


def well_formed(text: str, markup: str) -> bool:
    """Whether ``text`` is well-formed XML content ("xml": the standard library's parser) or
    HTML whose tags all close in order ("html")."""
    if markup == "xml":
        try:
            ET.fromstring(f"<r>{text}</r>")
        except ET.ParseError:
            return False
        return True
    check = _HTMLCheck()
    check.feed(text)
    check.close()
    return not check.broken and not check.stack
