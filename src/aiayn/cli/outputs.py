"""What ``aiayn translate`` prints and decodes beyond the best line of the beam search: n-best
lines or JSON lines with token scores (``aiayn.decode.nbest``), samples
(``aiayn.decode.sample``), prefixes and lexical constraints (``aiayn.decode.constraints``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..decode import Output, OutputConstraint, SearchRequest


@dataclass(frozen=True)
class PerLine:
    """A file of one line per input line (``--prefix``, ``--constraints``)."""

    option: str
    path: str
    lines: list[str] = field(repr=False)

    @classmethod
    def read(cls, option: str, path: str | None) -> PerLine | None:
        from ..files import read_lines

        return None if path is None else cls(option, path, read_lines(path))

    def __str__(self) -> str:
        return f"{self.option} {self.path}"

    def line(self, i: int) -> str:
        """Input line i's line (from 0); ``UserError`` when the file has fewer."""
        if i >= len(self.lines):
            raise UserError(
                f"{self} has {len(self.lines)} lines, the input at least {i + 1}: give one "
                "line per input line"
            )
        return self.lines[i]

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
    what ``cli.stream.translate_stream`` prints windows in."""

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
        constraints = PerLine.read("--constraints", args.constraints)
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

    def constraint(self, vocab: Any, i: int) -> OutputConstraint | None:
        """Input line i's prefix and phrases (i from 0); None when it has neither."""
        from ..decode import text_constraint

        prefix = self.prefix.line(i) if self.prefix else ""
        phrases = self.constraints.line(i).split("\t") if self.constraints else []
        files = " and ".join(str(f) for f in (self.prefix, self.constraints) if f)
        return text_constraint(vocab, prefix, phrases, where=f"{files}: line {i + 1}")

    def finish(self, count: int) -> None:
        """``count`` input lines: each per-line file must have as many (checked before
        translating a file, and after a stream, whose lines are counted as they come)."""
        for given in (self.prefix, self.constraints):
            if given is not None:
                given.check_count(count)

    def constrained(self, request: SearchRequest, vocab: Any, n: int) -> SearchRequest:
        """``request`` for a window of ``n`` lines, each with its prefix and phrases."""
        first = request.first_index
        assert isinstance(first, int)  # translate_corpus numbers a window by its first line
        constraints = tuple(self.constraint(vocab, first + i) for i in range(n))
        return replace(request, constraints=constraints)

    def constrained_for(self, translator: Any) -> Callable[[SearchRequest, int], SearchRequest]:
        """``Translator.windows``' ``per_window``: a window's request with its lines' own, in
        the vocabulary the Translator loads once ``windows`` has refused what it cannot do."""
        return lambda request, n: self.constrained(request, translator.vocab, n)

    def format(self, nbest: list[list[Output]], first: int) -> list[str]:
        """The lines printed for input lines ``first``, ``first`` + 1, ... and their outputs."""
        from ..decode import jsonl_line

        self.cut_lines.extend(first + i for i, outs in enumerate(nbest) if any(o.cut for o in outs))
        if self.fmt == "plain":
            return [_plain(outputs[0]) if outputs else "" for outputs in nbest]
        if self.fmt == "jsonl":
            return [jsonl_line(first + i, outputs) for i, outputs in enumerate(nbest)]
        return [o.moses(first + i) for i, outputs in enumerate(nbest) for o in outputs]


def _plain(output: Output) -> str:
    """The text, and `` ||| pairs`` with alignments (as Marian prints them)."""
    return output.text if output.alignment is None else f"{output.text} ||| {output.alignment}"
