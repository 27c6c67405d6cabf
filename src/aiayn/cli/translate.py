"""The commands that run a trained translation checkpoint: ``aiayn translate`` (raw text in,
detokenised text out, streamed), ``aiayn evaluate`` (BLEU and perplexity on a test set) and
``aiayn diagnose`` (does the model read its source?)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

from ..errors import UserError
from .common import (
    add_corpus_args,
    add_decode_args,
    add_engine_arg,
    add_shortlist_args,
    decode_precision,
    first_checkpoint,
    load_engine,
    say_wrote,
    search_request,
    show_progress,
    window_option,
)
from .outputs import Outputs

if TYPE_CHECKING:
    from ..decode import SearchRequest
    from ..decode.engine import Engine


def translate_stream(
    checkpoint: str | Path | Sequence[str | Path],
    source: IO[bytes],
    sink: TextIO,
    request: SearchRequest,
    *,
    device: str = "cpu",
    name: str = "<stdin>",
    prompt: bool = False,
    quantize: str | None = None,
    precision: str = "fp32",
    output: Outputs | None = None,
    engine: Engine | None = None,
    **corpus: Any,
) -> int:
    """Translate every line of the byte stream ``source`` to ``sink``, one line per line, order
    kept; returns the number of lines. Lines are read a window at a time, sorted by length
    within it and written (and flushed) in the input's order when the window is done
    (``aiayn.decode.translate_corpus``, whose options ``corpus`` holds: window, progress,
    total), so memory stays flat however long the input; ``request`` is the search.

    Lines are split by the rule of ``aiayn.files``. A line that is not valid UTF-8 gets an empty
    output line (so outputs stay aligned with inputs) and the rest is translated; then
    ``UserError`` names those lines (``name`` is what it calls the input). A line longer than
    the model's positions is truncated and named on stderr by its line in the input.
    ``prompt``: write "> " before reading each line (interactive: give window 1).
    ``quantize``: None or "int8", ``precision``: "fp32" or "bf16" (see ``aiayn.decode.quantize``).
    ``output``: what to print besides the best line (n-best lists, JSON lines, token scores,
    alignments) and the prefixes and constraints (default: the best line only). ``engine``:
    what decodes instead of our search (``aiayn.decode.engine``; ``checkpoint`` is then not
    loaded).
    """
    from ..decode import translate_corpus
    from ..files import split_lines

    decoder, vocab, outputs = _decoder(checkpoint, device, quantize, precision, output, engine)
    lines = _Lines(name)
    raw = split_lines(source)
    texts = lines.texts(_prompted(raw, sink) if prompt else raw)
    windows = translate_corpus(
        decoder,
        texts,
        vocab,
        request,
        outputs=outputs,
        on_truncate=partial(_say_truncated, name=name),
        **corpus,
    )
    for outs in windows:
        sink.write("".join(out + "\n" for out in outs))
        sink.flush()
    if output is not None:
        output.finish(lines.count)
        _say_cut(output)
    lines.check()
    return lines.count


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


def _decoder(
    checkpoint: str | Path | Sequence[str | Path],
    device: str,
    quantize: str | None,
    precision: str,
    output: Outputs | None,
    engine: Engine | None,
) -> tuple[Any, Any, Any]:
    """(what decodes, its vocabulary, what a window becomes) for ``translate_corpus``: our
    model(s) and ``translate`` / ``Outputs.lines``, or the engine and their engine versions."""
    from ..checkpoint import load_vocab
    from ..decode import load_models, translate
    from ..decode.engine import translate_with

    if engine is not None:
        vocab = load_vocab(first_checkpoint(checkpoint))
        return engine, vocab, translate_with if output is None else output.engine_lines
    model, vocab = load_models(checkpoint, device, quantize, precision)  # several: an Ensemble
    return model, vocab, translate if output is None else output.lines


@dataclass
class _Lines:
    """The texts of a stream's lines; one not valid UTF-8 becomes "" and is remembered, so
    that its output line keeps the others aligned and the end can name it."""

    name: str
    count: int = 0
    bad: int = 0
    first_bad: list[int] = field(default_factory=list)  # the first 10: memory stays flat

    def texts(self, raw: Iterable[bytes]) -> Iterator[str]:
        from ..files import decode_line

        for line in raw:
            self.count += 1
            try:
                yield decode_line(line, self.name, self.count)
            except UserError:
                self.bad += 1
                if len(self.first_bad) < 10:
                    self.first_bad.append(self.count)
                yield ""  # an empty line translates to an empty line

    def check(self) -> None:
        if self.bad:
            shown = ", ".join(map(str, self.first_bad)) + (", ..." if self.bad > 10 else "")
            raise UserError(
                f"{self.name}: {self.bad} line(s) not valid UTF-8 (line {shown}): their outputs "
                f"are empty lines; the other {self.count - self.bad} were translated"
            )


def _prompted(raw: Iterator[bytes], sink: TextIO) -> Iterator[bytes]:
    """``raw``'s lines, "> " written to ``sink`` before each is read (and before the end)."""
    while True:
        sink.write("> ")
        sink.flush()
        line = next(raw, None)
        if line is None:
            return
        yield line


def _say_truncated(index: int, tokens: int, cap: int, *, name: str) -> None:
    """``on_truncate`` of ``translate_corpus``: ``index`` counts the input's lines from 0."""
    print(
        f"aiayn translate: warning: {name}: line {index + 1}: {tokens} tokens, "
        f"more than the model's {cap} positions: truncated",
        file=sys.stderr,
    )


def _translate(args: argparse.Namespace) -> None:
    from ..files import count_lines, open_binary

    corpus = window_option(args)
    precision = decode_precision(args, "translate")
    source = (
        open_binary(args.input) if args.input else sys.stdin.buffer
    )  # bytes: aiayn.files splits lines
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    progress = show_progress(args) and not interactive
    if interactive:
        corpus["window"] = 1  # answer each line as it comes
    output = Outputs.from_args(args)
    counted = args.input or (_stdin_file() if output is not None else None)
    count = count_lines(counted) if counted and (progress or output is not None) else None
    if output is not None and count is not None:
        output.finish(count)  # --prefix/--constraints: one line per input line, checked first
    engine = load_engine(args)  # refuses the options it cannot honour first
    translate_stream(
        args.checkpoint,
        source,
        sys.stdout,
        search_request(args, sampling=True),
        device=args.device,
        name=args.input or "<stdin>",
        prompt=interactive,
        quantize=args.quantize,
        precision=precision.name,
        output=output,
        engine=engine,
        progress=progress,
        total=count if progress else None,
        **corpus,
    )


def _evaluate(args: argparse.Namespace) -> None:
    from ..evaluate import evaluate_checkpoint

    precision = decode_precision(args, "evaluate")
    engine = load_engine(args)
    request = search_request(args)
    result = evaluate_checkpoint(
        args.checkpoint,
        args.src,
        args.ref,
        args.output,
        request,
        lang=args.lang,
        device=args.device,
        quantize=args.quantize,
        engine=engine,
        precision=precision.name,
        progress=show_progress(args),
    )
    used = {"shortlist": request.shortlist.origin if request.shortlist else None}
    print(json.dumps({**result.as_dict(), **precision.as_dict(), **used}, indent=2))
    if args.output:
        say_wrote("evaluate", args.output)


def _diagnose(args: argparse.Namespace) -> None:
    from ..analysis.diagnose import encoder_spread, source_sensitivity
    from ..checkpoint import load_translator
    from ..evaluate import read_test_pair

    sources, references = (lines[: args.limit] for lines in read_test_pair(args.src, args.ref))
    model, vocab = load_translator(args.checkpoint, "cpu")
    report = {
        **source_sensitivity(model, vocab, sources, references),
        "encoder_spread": encoder_spread(model, vocab, sources),
    }
    print(json.dumps(report, indent=2))


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="translate a test set; SacreBLEU, paper BLEU, perplexity")
    add_decode_args(p)
    p.add_argument("--src", required=True, help="source text (.gz allowed)")
    p.add_argument("--ref", required=True, help="reference text (.gz allowed)")
    p.add_argument("--output", help="file to write the hypotheses to")
    p.add_argument("--lang", default="de", help="target language for the Moses tokeniser")
    add_engine_arg(p)
    add_corpus_args(p)
    add_shortlist_args(p)
    p.set_defaults(func=_evaluate)


def add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate raw text, one line in -> one line out")
    add_decode_args(p, outputs=True, ensemble=True)
    p.add_argument("--input", help="a text file (default: stdin)")
    p.add_argument("--interactive", action="store_true", help="prompt and answer line by line")
    add_engine_arg(p)
    add_corpus_args(p, window=True)
    add_shortlist_args(p)
    p.set_defaults(func=_translate)


def add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="does a checkpoint read its source? perplexity with rotated sources, "
        "encoder collapse per layer",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="source text, e.g. the validation split")
    p.add_argument("--ref", required=True, help="reference text")
    p.add_argument("--limit", type=int, help="the first N sentences only")
    p.set_defaults(func=_diagnose)
