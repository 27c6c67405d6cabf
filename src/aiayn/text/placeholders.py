"""What must come out of a translation exactly as it went in: format strings, URLs, e-mail
addresses, numbers, entities, and tags (``--placeholders``, ``--markup``).

The built-in patterns, tried in this order at each position (the first that matches wins):
url, email, python (``%(name)s``), printf (``%s``, ``%1$d``, ``%-5.2f``), braces (``{name}``,
``{0}``, ``{{var}}``), entity (``&amp;``, ``&#39;``), number (``3``, ``-5``, ``1,000.50``,
``1e-3``). A user's patterns (``--placeholder-pattern``) come before them all. Under
``--markup`` tags (and comments, CDATA sections, declarations) come first and entities are
always kept; a ``>`` inside a quoted attribute value does not end its tag.

Each pattern is compiled on its own, not joined into one alternation: a user's pattern means
what it means alone, its inline flags (``(?i)``), groups and backreferences included.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import UserError

BUILT_IN = {
    "url": r"\b(?:https?|ftp)://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b",
    "python": r"%\([\w.]+\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",
    "printf": r"%(?:\d+\$)?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?"
    r"[diouxXeEfFgGaAcspn@%]",
    "braces": r"\{\{[^{}]*\}\}|\{[\w.:\[\]!-]*\}",
    "entity": r"&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);",
    # a sign that follows no word character is the number's ("-5", not "5-3"); an exponent too
    "number": r"(?<![\w.,])(?:[-+\u2212](?=\d))?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?(?![\w])",
}
TAG = (
    r"<!\[CDATA\[.*?\]\]>|<!--.*?-->|<[!?][^<>]*>"
    r"|</?[A-Za-z][\w:.-]*(?:\s+(?:\"[^\"]*\"|'[^']*'|[^'\"<>])*)?/?>"
)


@dataclass(frozen=True)
class Placeholders:
    """What is taken out: ``patterns`` as (kind, compiled pattern), kind "tag" or "ph",
    tried in order at each position as an alternation would (the leftmost match, the first
    pattern at a tie), each compiled alone."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...]

    def scan(self, text: str) -> Iterator[tuple[str, re.Match[str]]]:
        """(kind, match) of every thing taken out of ``text``, left to right, none empty."""
        at, nexts = 0, [p.search(text) for _, p in self.patterns]
        while True:
            for i, (_, p) in enumerate(self.patterns):
                while (m := nexts[i]) is not None and (m.start() < at or m.end() == m.start()):
                    nexts[i] = p.search(text, max(at, m.start() + 1))  # empty: nothing taken
            found = [(m.start(), i) for i, m in enumerate(nexts) if m is not None]
            if not found:
                return
            i = min(found)[1]
            match = nexts[i]
            assert match is not None  # i is one of found's
            yield self.patterns[i][0], match
            at = match.end()

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """The matches of ``scan``."""
        return (m for _, m in self.scan(text))

    def fullmatch(self, text: str) -> bool:
        """Whether ``text`` is one thing taken out whole."""
        return any(p.fullmatch(text) for _, p in self.patterns)


def placeholder_pattern(
    *,
    markup: bool,
    built_in: bool,
    user: tuple[str, ...] = (),
    option: str = "--placeholder-pattern",
) -> Placeholders:
    """Tags (kind "tag", under ``markup``), then the user's patterns and the built-in ones
    (kind "ph"). A user pattern that does not compile, or that matches the empty string
    (it would take nothing out), is refused in one line naming ``option``."""
    compiled = []
    for pattern in user:
        try:
            found = re.compile(pattern, re.DOTALL)
        except re.error as e:
            raise UserError(f"{option} {pattern!r}: {e}") from None
        if found.fullmatch(""):
            raise UserError(f"{option} {pattern!r} matches the empty string: it takes nothing out")
        compiled.append(found)
    others = [*(BUILT_IN.values() if built_in else ())]
    if markup and not built_in:
        others.append(BUILT_IN["entity"])  # the model's & would otherwise break the markup
    kinds = [("tag", re.compile(TAG, re.DOTALL))] if markup else []
    kinds += [("ph", p) for p in compiled] + [("ph", re.compile(p, re.DOTALL)) for p in others]
    return Placeholders(tuple(kinds))
