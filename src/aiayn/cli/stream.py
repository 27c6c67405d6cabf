"""``aiayn translate``'s stream of lines: stdin or a file read line by line (bytes, split by
``aiayn.files``' rule), each line's output written as its window is done, the ``> `` prompt
of ``--interactive``, and the command's warnings on stderr. It belongs to the command line:
``aiayn.Translator`` translates windows of lines and knows nothing of terminals."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ..decode import SearchRequest
    from ..translator import Translator
    from .outputs import Outputs

WINDOW = 100_000  # decode.translate.WINDOW, named here so that --help does not import torch


@dataclass
class TextStream:
    """Lines in (bytes), their outputs out (one line each, flushed a window at a time).
    ``name``: what messages call the input; ``prompt``: "> " before each line is read;
    ``window``: lines sorted and written together; ``progress`` a bar on stderr (``total``:
    the lines, for its ETA); ``around``: --split or --markup's wrapper of the best lines."""

    source: IO[bytes]
    sink: TextIO
    name: str = "<stdin>"
    prompt: bool = False
    window: int = WINDOW
    progress: bool = False
    total: int | None = None
    around: Callable[[Any], Any] | None = None
    terms: int = 0  # a glossary's terms applied, and in how many lines
    lines_with_terms: int = 0

    def say_truncated(self, index: int, tokens: int, cap: int) -> None:
        """``on_truncate`` of ``translate_corpus``: ``index`` counts the input's lines from 0."""
        print(
            f"aiayn translate: warning: {self.name}: line {index + 1}: {tokens} tokens, "
            f"more than the model's {cap} positions: truncated",
            file=sys.stderr,
        )

    def count_terms(self, nbest: list[list[Any]]) -> None:
        """Count a window's glossary terms, which its outputs name (``Output.terms``)."""
        applied = [len(outputs[0].terms) for outputs in nbest if outputs and outputs[0].terms]
        self.terms += sum(applied)
        self.lines_with_terms += len(applied)

    def corpus(self) -> dict[str, Any]:
        """How ``Translator.windows`` / ``best_lines`` read this stream."""
        return {
            "window": self.window,
            "progress": self.progress,
            "total": self.total,
            "on_truncate": self.say_truncated,
        }

    def write(self, lines: list[str]) -> None:
        self.sink.write("".join(line + "\n" for line in lines))
        self.sink.flush()


def translate_stream(
    stream: TextStream,
    translator: Translator,
    request: SearchRequest,
    output: Outputs | None = None,
) -> int:
    """Translate every line of ``stream`` to its sink, one line per line, order kept; returns
    the number of lines. Memory stays flat however long the input (``Translator.windows``).

    A line that is not valid UTF-8 gets an empty output line (so outputs stay aligned with
    inputs) and the rest is translated; then ``UserError`` names those lines. A line longer
    than the model's positions is truncated and named on stderr by its line in the input.
    ``output``: what to print besides the best line (default: the best line only).
    """
    from ..files import LenientLines, split_lines

    lines = LenientLines(stream.name)
    raw = split_lines(stream.source)
    texts = lines.texts(_prompted(raw, stream.sink) if stream.prompt else raw)
    if stream.around is not None:  # the best lines, split and joined or marked up
        for best in translator.best_lines(texts, request, stream.around, **stream.corpus()):
            stream.write(best)
        lines.check()
        return lines.count
    windows = translator.windows(
        texts,
        request,
        token_scores=output.token_scores if output else False,
        alignment_layer=output.alignment_layer if output else None,
        per_window=output.constrained_for(translator) if output else None,
        **stream.corpus(),
    )
    first = 0
    for nbest in windows:
        stream.count_terms(nbest)
        stream.write(output.format(nbest, first) if output else [_best(o) for o in nbest])
        first += len(nbest)
    if output is not None:
        output.finish(lines.count)
    lines.check()
    return lines.count


def _best(outputs: list[Any]) -> str:
    return outputs[0].text if outputs else ""


def _prompted(raw: Iterator[bytes], sink: TextIO) -> Iterator[bytes]:
    """``raw``'s lines, "> " written to ``sink`` before each is read (and before the end)."""
    while True:
        sink.write("> ")
        sink.flush()
        line = next(raw, None)
        if line is None:
            return
        yield line
