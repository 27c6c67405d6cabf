"""``aiayn translate``'s stream of lines: stdin or a file read line by line (bytes, split by
``aiayn.files``' rule), each line's output written as its window is done, in the form the
options ask for (the best line, n-best lines, JSON lines; ``--split`` and ``--markup`` around
the best line), the ``> `` prompt of ``--interactive``, and the command's warnings on stderr.
It belongs to the command line: ``aiayn.Translator`` translates windows of lines, with each
line's prefix and phrases, and knows nothing of terminals or files."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, TextIO

from ..errors import UserError
from .common import show_progress

if TYPE_CHECKING:
    from ..decode import Output, SearchRequest
    from ..translator import Translator


@dataclass(frozen=True)
class PerLine(Sequence[Any]):
    """A file of one line per input line (``--prefix``, ``--constraints``), indexed by the
    input line's number as ``Translator.windows`` reads it; ``tabs``: a line's phrases are
    separated by tabs."""

    option: str
    path: str
    lines: list[str] = field(repr=False)
    tabs: bool = False

    @classmethod
    def read(cls, option: str, path: str | None, *, tabs: bool = False) -> PerLine | None:
        from ..files import read_lines

        return None if path is None else cls(option, path, read_lines(path), tabs)

    def __str__(self) -> str:
        return f"{self.option} {self.path}"

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: Any) -> Any:
        """Input line i's line (from 0), or its phrases; ``UserError`` when the file has
        fewer lines."""
        if i >= len(self.lines):
            raise UserError(
                f"{self} has {len(self.lines)} lines, the input at least {i + 1}: give one "
                "line per input line"
            )
        return self.lines[i].split("\t") if self.tabs else self.lines[i]

    def check_count(self, count: int) -> None:
        if len(self.lines) != count:
            raise UserError(
                f"{self} has {len(self.lines)} lines, the input {count}: give one line per "
                "input line"
            )


@dataclass(frozen=True)
class Outputs:
    """The best line of another search (``plain``: samples, constraints), n-best lines
    (``moses``) or JSON lines (``jsonl``), decoded with or without sampling and constraints:
    what ``translate_stream`` prints windows in."""

    fmt: str  # "plain", "moses" or "jsonl"
    token_scores: bool = False
    sampling: bool = False  # --sample: its settings are the request's
    prefix: PerLine | None = None
    constraints: PerLine | None = None
    alignment_layer: int | None = None  # None: no alignments
    cut_lines: list[int] = field(default_factory=list)  # input lines with an output cut short

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Outputs | None:
        """None when no option asks for more than the best line of the beam search."""
        fmt = args.format or ("jsonl" if args.token_scores else "text")
        if args.token_scores and fmt != "jsonl":
            raise UserError("--token-scores prints JSON lines: drop --format text")
        if fmt == "text":
            fmt = "plain" if args.nbest is None else "moses"
        sampling = bool(args.sample)
        prefix = PerLine.read("--prefix", args.prefixes)
        constraints = PerLine.read("--constraints", args.constraints, tabs=True)
        if args.alignment_layer is not None and not args.alignments:
            raise UserError(
                "--alignment-layer chooses the layer that aligns: give --alignments too"
            )
        layer = None
        if args.alignments:
            layer = -1 if args.alignment_layer is None else args.alignment_layer
        if fmt == "plain" and not sampling and (prefix, constraints, layer) == (None,) * 3:
            return None
        return cls(fmt, args.token_scores, sampling, prefix, constraints, layer)

    def where(self, i: int) -> str:
        """How an error names input line i's prefix and phrases (i from 0)."""
        files = " and ".join(str(f) for f in (self.prefix, self.constraints) if f)
        return f"{files}: line {i + 1}"

    def finish(self, count: int) -> None:
        """``count`` input lines: each per-line file must have as many (checked before
        translating a file, and after a stream, whose lines are counted as they come)."""
        for given in (self.prefix, self.constraints):
            if given is not None:
                given.check_count(count)

    def windows(self) -> dict[str, Any]:
        """What ``Translator.windows`` decodes with besides the lines and the request."""
        return {
            "prefixes": self.prefix,
            "constraints": self.constraints,
            "where": self.where,
            "token_scores": self.token_scores,
            "alignment_layer": self.alignment_layer,
        }

    def format(self, nbest: list[list[Output]], first: int) -> list[str]:
        """The lines printed for input lines ``first``, ``first`` + 1, ... and their outputs."""
        from ..decode import jsonl_line

        self.cut_lines.extend(first + i for i, outs in enumerate(nbest) if any(o.cut for o in outs))
        if self.fmt == "plain":
            return [_plain(outputs[0]) if outputs else "" for outputs in nbest]
        if self.fmt == "jsonl":
            return [jsonl_line(first + i, outputs) for i, outputs in enumerate(nbest)]
        return [o.moses(first + i) for i, outputs in enumerate(nbest) for o in outputs]


@dataclass
class TextStream:
    """Lines in (bytes), their outputs out (one line each, flushed a window at a time).
    ``name``: what messages call the input; ``prompt``: "> " before each line is read;
    ``window``: lines sorted and written together (None: the library's); ``progress`` a bar
    on stderr (``total``: the lines, for its ETA); ``around``: --split or --markup's wrapper
    of the best lines."""

    source: IO[bytes]
    sink: TextIO
    name: str = "<stdin>"
    prompt: bool = False
    window: int | None = None
    progress: bool = False
    total: int | None = None
    around: Callable[[Any], Any] | None = None
    terms: int = 0  # a glossary's terms applied, and in how many lines
    lines_with_terms: int = 0

    def say_truncated(self, index: int, tokens: int, cap: int) -> None:
        """``on_truncate`` of the windows: ``index`` counts the input's lines from 0."""
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


def translate_lines(
    args: argparse.Namespace, translator: Translator, request: SearchRequest
) -> None:
    """``aiayn translate`` once its options are checked: ``--input`` (or stdin) to stdout in
    the form the output options ask for, with the command's warnings on stderr."""
    from ..files import count_lines, open_binary

    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    progress = show_progress(args.quiet) and not interactive
    window = args.window
    if interactive and (window is None or window >= 1):  # a bad --window is still refused
        window = 1  # answer each line as it comes
    output = Outputs.from_args(args)
    counted = args.input or (_stdin_file() if output is not None else None)
    count = count_lines(counted) if counted and (progress or output is not None) else None
    if output is not None and count is not None:
        output.finish(count)  # --prefix/--constraints: one line per input line, checked first
    split = _split_option(args, output)
    stream = TextStream(
        open_binary(args.input) if args.input else sys.stdin.buffer,  # bytes: aiayn.files splits
        sys.stdout,
        name=args.input or "<stdin>",
        prompt=interactive,
        window=window,
        around=_markup_option(args, output) or split,
        progress=progress,
        total=count if progress else None,
    )
    lines = translate_stream(stream, translator, request, output)
    if output is not None:
        _say_cut(output)
    if request.glossary is not None:
        print(
            f"aiayn translate: --glossary {args.glossary}: {stream.terms} term(s) applied in "
            f"{stream.lines_with_terms} of {lines} line(s)",
            file=sys.stderr,
        )
    if split is not None:
        _say_split(split)


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
    decoded = output.windows() if output else {}
    first = 0
    for nbest in translator.windows(texts, request, **decoded, **stream.corpus()):
        stream.count_terms(nbest)
        stream.write(output.format(nbest, first) if output else [_best(o) for o in nbest])
        first += len(nbest)
    if output is not None:
        output.finish(lines.count)
    lines.check()
    return lines.count


def _split_option(args: argparse.Namespace, output: Outputs | None) -> Any:
    """``--split``'s wrapper of the window outputs, or None; its limit and language come from
    the checkpoint's meta (``document.trained_limit``, the dataset's source language)."""
    if args.split is None:
        return None
    if output is not None:
        raise UserError(
            "--split joins sentences back into lines: n-best lists, JSON, scores, alignments, "
            "prefixes and constraints are per sentence (give one sentence a line instead)"
        )
    from functools import partial as bind

    from ..checkpoint import follow_pointer, read_meta, recorded_language
    from ..text.document import SplitCounts, SplitOutputs, trained_limit

    checkpoints = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]
    first = follow_pointer(checkpoints[0])
    meta = read_meta(first)
    lang = args.split
    if lang == "auto":
        lang = recorded_language(first, "src") or "en"
    limit, name = trained_limit(meta), args.input or "<stdin>"
    return bind(SplitOutputs, lang=lang, limit=limit, name=name, counts=SplitCounts())


def _markup_option(args: argparse.Namespace, output: Outputs | None) -> Any:
    """``--markup`` / ``--placeholders``' wrapper of the window outputs, or None."""
    user = tuple(args.placeholder_pattern or ())
    if args.markup is None and not args.placeholders and not user:
        return None
    if output is not None or args.split is not None:
        raise UserError(
            "--markup and --placeholders put tags back into the best line of one sentence: "
            "not with --split, n-best lists, JSON, scores, alignments, prefixes or constraints"
        )
    from ..text.marked import MarkupOutputs
    from ..text.placeholders import placeholder_pattern

    pattern = placeholder_pattern(
        markup=args.markup is not None, built_in=args.placeholders, user=user
    )
    return lambda _: MarkupOutputs(args.markup, pattern)


def _stdin_file() -> str | None:
    """A path that reads stdin's file again when stdin is a regular file (``< in.en``), so
    that its lines are counted before translating, as ``--input``'s are; None for a pipe."""
    try:
        regular = stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError):  # no file descriptor (a test's stdin, a closed one)
        return None
    return "/dev/stdin" if regular and os.path.exists("/dev/stdin") else None


def _say_cut(output: Outputs) -> None:
    """Name the lines whose printed log-prob has no eos, which ``aiayn score`` would add."""
    if output.cut_lines and output.fmt != "plain":
        lines = ", ".join(str(i + 1) for i in output.cut_lines[:10])
        more = f" and {len(output.cut_lines) - 10} more" if len(output.cut_lines) > 10 else ""
        print(
            f"aiayn translate: warning: {len(output.cut_lines)} input line(s) have an output "
            f"cut at the length limit, without eos (lines {lines}{more}; JSON lines mark them "
            '"cut"): aiayn score --no-eos rescores such an output to its printed score',
            file=sys.stderr,
        )


def _say_split(split: Any) -> None:
    """How many lines --split split, and cut for length, on stderr."""
    counts, limit = split.keywords["counts"], split.keywords["limit"]
    print(
        f"aiayn translate: --split: {counts.lines} line(s) held several sentences; "
        f"{counts.cut} had a sentence longer than the {limit} source positions the model was "
        "trained on, cut at clause punctuation or spaces",
        file=sys.stderr,
    )


def _best(outputs: list[Any]) -> str:
    return outputs[0].text if outputs else ""


def _plain(output: Output) -> str:
    """The text, and `` ||| pairs`` with alignments (as Marian prints them)."""
    return output.text if output.alignment is None else f"{output.text} ||| {output.alignment}"


def _prompted(raw: Iterator[bytes], sink: TextIO) -> Iterator[bytes]:
    """``raw``'s lines, "> " written to ``sink`` before each is read (and before the end)."""
    while True:
        sink.write("> ")
        sink.flush()
        line = next(raw, None)
        if line is None:
            return
        yield line
