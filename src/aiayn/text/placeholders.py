"""What must come out of a translation exactly as it went in: format strings, URLs, e-mail
addresses, numbers, entities, and tags (``--placeholders``, ``--markup``), as one pattern.

The built-in patterns, tried in this order at each position (the first that matches wins):
url, email, python (``%(name)s``), printf (``%s``, ``%1$d``, ``%-5.2f``), braces (``{name}``,
``{0}``, ``{{var}}``), entity (``&amp;``, ``&#39;``), number (``3``, ``1,000.50``). A user's
patterns (``--placeholder-pattern``) come before them all. Under ``--markup`` tags (and
comments, declarations) come first and entities are always kept; a ``>`` inside a quoted
attribute value does not end its tag.
"""

from __future__ import annotations

import re

from ..errors import UserError

BUILT_IN = {
    "url": r"\b(?:https?|ftp)://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b",
    "python": r"%\([\w.]+\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",
    "printf": r"%(?:\d+\$)?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?"
    r"[diouxXeEfFgGaAcspn@%]",
    "braces": r"\{\{[^{}]*\}\}|\{[\w.:\[\]!-]*\}",
    "entity": r"&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);",
    "number": r"(?<![\w.,])\d+(?:[.,]\d+)*(?![\w])",
}
TAG = r"<!--.*?-->|<[!?][^<>]*>|</?[A-Za-z][\w:.-]*(?:\s+(?:\"[^\"]*\"|'[^']*'|[^'\"<>])*)?/?>"


def placeholder_pattern(
    *,
    markup: bool,
    built_in: bool,
    user: tuple[str, ...] = (),
    option: str = "--placeholder-pattern",
) -> re.Pattern[str]:
    """One pattern: named group ``tag`` for tags (under ``markup``), ``ph`` for the rest.
    A user pattern that does not compile is refused in one line naming ``option``."""
    for pattern in user:
        try:
            re.compile(pattern)
        except re.error as e:
            raise UserError(f"{option} {pattern!r}: {e}") from None
    others = [*user, *(BUILT_IN.values() if built_in else ())]
    if markup and not built_in:
        others.append(BUILT_IN["entity"])  # the model's & would otherwise break the markup
    parts = ([f"(?P<tag>{TAG})"] if markup else []) + (
        [f"(?P<ph>{'|'.join(f'(?:{p})' for p in others)})"] if others else []
    )
    return re.compile("|".join(parts), re.DOTALL)
