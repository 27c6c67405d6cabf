"""Documents in, documents out (``translate --split``): each line split into sentences
(``segment``), every sentence of a window translated in one batch, and the translations joined
back with the line's own spaces, so that output line N is the translation of input line N,
blank lines and the spaces around and between sentences kept.

A sentence longer than the longest source the model was trained on (``trained_limit``) would
be translated badly or truncated: it is cut at the clause punctuation (, ; :) nearest its
middle, else at the space nearest it, until every piece fits; a piece with no space to cut at
is translated whole with a warning (and truncated with one where it exceeds the model's
positions, as without ``--split``). Nothing is truncated silently.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .segment import Span, sentence_spans

CLAUSE = re.compile(r"[,;:]\s+")  # a cut after clause punctuation keeps the clauses whole
SPACE = re.compile(r"\s+")


def trained_limit(meta: dict[str, Any]) -> int:
    """The most source positions (subwords + eos) of a checkpoint's ``meta``: its training
    split's longest source (``longest_src_tokens``, recorded by ``aiayn prepare``) plus eos,
    else the model's positions (a dataset prepared before it was recorded)."""
    train = meta.get("dataset", {}).get("splits", {}).get("train", {})
    if "longest_src_tokens" in train:
        return int(train["longest_src_tokens"]) + 1
    return int(meta["model_config"]["max_len"])


@dataclass
class SplitCounts:
    """What ``--split`` did: lines of several sentences, sentences cut for length."""

    lines: int = 0
    cut: int = 0


def split_line(
    text: str, lang: str, count: Callable[[str], int], limit: int, *, where: str
) -> tuple[list[Span], bool]:
    """``text``'s sentences as spans, long ones cut so that ``count`` (the source positions of
    a piece) is at most ``limit``; and whether one was cut. ``where`` names the line in the
    warning about a piece that cannot be cut."""
    spans, cut = [], False
    for start, end in sentence_spans(text, lang):
        pieces = _cut(text, start, end, count, limit, where)
        spans += pieces
        cut |= len(pieces) > 1
    return spans, cut


def _cut(
    text: str, start: int, end: int, count: Callable[[str], int], limit: int, where: str
) -> list[Span]:
    """[start, end) as pieces of at most ``limit`` positions, each cut near the middle."""
    n = count(text[start:end])
    if n <= limit:
        return [(start, end)]
    piece = text[start:end]
    points = [start + m.end() for m in CLAUSE.finditer(piece) if m.end() < len(piece)]
    if not points:
        points = [start + m.end() for m in SPACE.finditer(piece) if 0 < m.start()]
    if not points:  # translated whole, as without --split: one piece does not stop the file
        warnings.warn(
            f"{where}: a sentence of {n} source positions, more than the {limit} the model was "
            "trained on, has no space to cut it at: translated whole (cut at the model's "
            "positions if longer)",
            stacklevel=2,
        )
        return [(start, end)]
    middle = (start + end) / 2
    at = min(points, key=lambda p: abs(p - middle))  # where the second piece starts
    left = at
    while text[left - 1].isspace():
        left -= 1
    return _cut(text, start, left, count, limit, where) + _cut(text, at, end, count, limit, where)


def join_line(text: str, spans: Sequence[Span], translations: Sequence[str]) -> str:
    """``text`` with each span replaced by its translation: the spaces around and between
    the sentences are the source's. A blank line stays as it is."""
    if not spans:
        return text
    pieces = zip(around_spans(text, spans), translations, strict=True)
    return "".join(before + translation + after for (before, after), translation in pieces)


def around_spans(text: str, spans: Sequence[Span]) -> list[tuple[str, str]]:
    """What comes before and after each sentence of ``text`` in its translation: the line's
    leading spaces before the first, and after each the source's text up to the next (after the
    last: to the line's end). ``before + translation + after``, sentence by sentence, is the
    line's translation (``join_line``): a stream sends each sentence as that piece."""
    nexts = [start for start, _ in spans[1:]] + [len(text)]
    return [
        (text[:start] if i == 0 else "", text[end:following])
        for i, ((start, end), following) in enumerate(zip(spans, nexts))
    ]


@dataclass
class SplitOutputs:
    """A ``WindowOutputs`` (``aiayn.decode.translate``) that splits each line of a window into
    sentences, has ``inner`` translate them all in one call, and joins them back per line.

    ``limit``: source positions a piece may take (``trained_limit``); ``name``: the input, for
    the refusals; ``counts``: what was split, summed over windows."""

    inner: Any  # WindowOutputs: translate, or an engine's translate_with
    lang: str = "en"
    limit: int = 256
    name: str = "<stdin>"
    counts: SplitCounts = field(default_factory=SplitCounts)

    def __call__(
        self,
        model: Any,
        texts: list[str],
        tokenizer: Any,
        request: Any,
        *,
        progress: Any,
        on_truncate: Any,
    ) -> list[str]:
        first = request.first_index if isinstance(request.first_index, int) else 0
        count = lambda s: len(tokenizer.encode_source(s))  # noqa: E731
        per_line, sentences, line_of = [], [], []
        for i, text in enumerate(texts):
            where = f"{self.name}: line {first + i + 1}"
            spans, cut = split_line(text, self.lang, count, self.limit, where=where)
            per_line.append(spans)
            sentences += [text[a:b] for a, b in spans]
            line_of += [first + i] * len(spans)
            self.counts.lines += len(spans) > 1
            self.counts.cut += cut
        report = None
        if on_truncate is not None:  # by line of the input, not by sentence
            report = lambda j, tokens, cap: on_truncate(line_of[j] - first, tokens, cap)  # noqa: E731
        outs = iter(
            self.inner(
                model,
                sentences,
                tokenizer,
                replace(request, first_index=first),
                progress=False,
                on_truncate=report,
            )
        )
        return [
            join_line(text, spans, [next(outs) for _ in spans])
            for text, spans in zip(texts, per_line)
        ]
