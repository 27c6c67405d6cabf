"""The commands that run a trained translation checkpoint: ``aiayn translate`` (raw text in,
detokenised text out, streamed), ``aiayn evaluate`` (BLEU and perplexity on a test set) and
``aiayn diagnose`` (does the model read its source?)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from ..errors import UserError
from .common import add_decode_args, decode_config, say_wrote
from .outputs import Outputs

if TYPE_CHECKING:
    from ..decode import DecodeConfig


def translate_stream(
    checkpoint: str | Path | Sequence[str | Path],
    source: IO[bytes],
    sink: TextIO,
    decode: DecodeConfig,
    device: str = "cpu",
    chunk: int = 64,
    prompt: bool = False,
    name: str = "<stdin>",
    quantize: str | None = None,
    output: Outputs | None = None,
) -> int:
    """Translate every line of the byte stream ``source`` to ``sink``, one line per line, order
    kept, flushed chunk by chunk so that a pipe sees results as they come; returns the number
    of lines.

    Lines are split by the rule of ``aiayn.io``. A line that is not valid UTF-8 gets an empty
    output line (so outputs stay aligned with inputs) and the rest is translated; then
    ``UserError`` names those lines (``name`` is what it calls the input). A line longer than
    the model's positions is truncated and named on stderr by its line in the input.
    ``quantize``: None or "int8" (see ``aiayn.decode.quantize``). ``output``: what to print
    besides the best line (n-best lists, JSON lines), samples, prefixes and constraints
    (default: the beam search's best translation only).
    """
    from ..decode import load_models, translate
    from ..io import decode_line, split_lines

    if chunk < 1:
        raise UserError(f"--chunk must be at least 1, got {chunk}")
    model, vocab = load_models(checkpoint, device, quantize)  # several: an Ensemble
    lines = enumerate(split_lines(source), start=1)
    count, bad = 0, []
    while True:
        if prompt:
            sink.write("> ")
            sink.flush()
        texts = []
        for lineno, raw in islice(lines, chunk):
            try:
                texts.append(decode_line(raw, name, lineno))
            except UserError:
                bad.append(lineno)
                texts.append("")  # an empty line translates to an empty line
        if not texts:
            break
        report = partial(_say_truncated, name=name, first=count + 1)
        outs = (
            translate(
                model, texts, vocab, decode, batch_size=chunk, max_tokens=8000, on_truncate=report
            )
            if output is None
            else output.lines(
                model, texts, vocab, decode, first=count, batch_size=chunk, on_truncate=report
            )
        )
        for out in outs:
            sink.write(out + "\n")
        sink.flush()
        count += len(texts)
    if output is not None:
        output.finish(count)
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        raise UserError(
            f"{name}: {len(bad)} line(s) not valid UTF-8 (line {shown}): their outputs are "
            f"empty lines; the other {count - len(bad)} were translated"
        )
    return count


def _say_truncated(index: int, tokens: int, cap: int, *, name: str, first: int) -> None:
    """``on_truncate`` for a chunk whose first text is line ``first`` of ``name``."""
    print(
        f"aiayn translate: warning: {name}: line {first + index}: {tokens} tokens, "
        f"more than the model's {cap} positions: truncated",
        file=sys.stderr,
    )


def _translate(args: argparse.Namespace) -> None:
    from ..io import open_binary

    source = (
        open_binary(args.input) if args.input else sys.stdin.buffer
    )  # bytes: aiayn.io splits lines
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    translate_stream(
        args.checkpoint,
        source,
        sys.stdout,
        decode_config(args),
        device=args.device,
        chunk=1 if interactive else args.chunk,
        prompt=interactive,
        name=args.input or "<stdin>",
        quantize=args.quantize,
        output=Outputs.from_args(args),
    )


def _evaluate(args: argparse.Namespace) -> None:
    from ..evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(
        args.checkpoint,
        args.src,
        args.ref,
        args.output,
        decode_config(args),
        lang=args.lang,
        device=args.device,
        quantize=args.quantize,
    )
    print(json.dumps(result.as_dict(), indent=2))
    if args.output:
        say_wrote("evaluate", args.output)


def _diagnose(args: argparse.Namespace) -> None:
    from ..analysis.diagnose import encoder_spread, source_sensitivity
    from ..checkpoint import VOCAB, load_transformer
    from ..data import Vocab
    from ..evaluate import read_test_pair

    sources, references = (lines[: args.limit] for lines in read_test_pair(args.src, args.ref))
    model, _ = load_transformer(args.checkpoint, "cpu")
    vocab = Vocab.load(Path(args.checkpoint) / VOCAB)
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
    p.set_defaults(func=_evaluate)


def add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate raw text, one line in -> one line out")
    add_decode_args(p, outputs=True, ensemble=True)
    p.add_argument("--input", help="a text file (default: stdin)")
    p.add_argument("--interactive", action="store_true", help="prompt and answer line by line")
    p.add_argument(
        "--chunk", type=int, default=64, help="lines decoded together when reading a file"
    )
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
