"""Sentences of a line, as character spans of the line itself: Moses' sentence-splitter rules
(the ``sentence-splitter`` package), chosen by ``scripts/compare_segmenters.py`` over pysbd and
sentencex (docs/documents.md: the most paragraphs split exactly right, quotes closing a
sentence above all).

The splitter gives sentences with runs of spaces collapsed, so the spans are found by matching
non-space characters in order; its output holding other characters than the line's is a bug.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import UserError

Span = tuple[int, int]


@lru_cache(maxsize=8)
def _splitter(lang: str):
    from sentence_splitter import SentenceSplitter, SentenceSplitterException

    try:
        return SentenceSplitter(language=lang)
    except SentenceSplitterException:
        raise UserError(
            f"--split {lang}: no sentence rules for that language (an ISO 639-1 code: en, es, de, fr, ...)"
        ) from None


def sentence_spans(text: str, lang: str = "en") -> list[Span]:
    """The (start, end) of each sentence of ``text`` (no newline in it), in order, without the
    spaces around them; [] when ``text`` is blank. ``lang``: an ISO 639-1 code the splitter
    has abbreviations for (en, es, de, fr, ...)."""
    if not text.strip():
        return []
    sentences = _splitter(lang).split(text)
    at = [i for i, c in enumerate(text) if not c.isspace()]  # the line's non-space characters
    spans, k = [], 0
    for sentence in sentences:
        chars = [c for c in sentence if not c.isspace()]
        if not chars:
            continue
        if "".join(chars) != "".join(text[i] for i in at[k : k + len(chars)]):
            raise AssertionError(f"the segmenter changed the text of {text!r}")
        spans.append((at[k], at[k + len(chars) - 1] + 1))
        k += len(chars)
    return spans
