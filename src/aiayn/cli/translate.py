"""The commands that run a trained translation checkpoint: ``aiayn translate`` (raw text in,
detokenised text out, streamed), ``aiayn evaluate`` (BLEU and perplexity on a test set) and
``aiayn diagnose`` (does the model read its source?)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from typing import Any

from ..errors import UserError
from .common import say_wrote, show_progress, window_option
from .decoding import (
    add_corpus_args,
    add_decode_args,
    add_engine_arg,
    add_shortlist_args,
    open_decoding,
)
from .outputs import Outputs


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


def _translate(args: argparse.Namespace) -> None:
    from ..files import count_lines, open_binary
    from .stream import TextStream, translate_stream

    corpus = window_option(args)
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    progress = show_progress(args) and not interactive
    translator, request = open_decoding(args, "translate")  # every option checked, none loaded
    if interactive:
        corpus["window"] = 1  # answer each line as it comes
    output = Outputs.from_args(args)
    counted = args.input or (_stdin_file() if output is not None else None)
    count = count_lines(counted) if counted and (progress or output is not None) else None
    if output is not None and count is not None:
        output.finish(count)  # --prefix/--constraints: one line per input line, checked first
    split = _split_option(args, output)
    around = _markup_option(args, output) or split
    stream = TextStream(
        open_binary(args.input) if args.input else sys.stdin.buffer,  # bytes: aiayn.files splits
        sys.stdout,
        name=args.input or "<stdin>",
        prompt=interactive,
        around=around,
        progress=progress,
        total=count if progress else None,
        **corpus,
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


def _say_split(split: Any) -> None:
    """How many lines --split split, and cut for length, on stderr."""
    counts, limit = split.keywords["counts"], split.keywords["limit"]
    print(
        f"aiayn translate: --split: {counts.lines} line(s) held several sentences; "
        f"{counts.cut} had a sentence longer than the {limit} source positions the model was "
        "trained on, cut at clause punctuation or spaces",
        file=sys.stderr,
    )


def _evaluate(args: argparse.Namespace) -> None:
    from ..evaluate import read_evaluation_inputs

    translator, request = open_decoding(args, "evaluate")  # every option checked, none loaded
    sources, references = read_evaluation_inputs(args.src, args.ref, args.output, args.checkpoint)
    lang = args.lang or translator.target_language()
    if lang is None:
        print(
            f"aiayn evaluate: {translator.checkpoints[0]} records no target language: paper BLEU "
            "tokenises as German (de); give --lang for another",
            file=sys.stderr,
        )
        lang = "de"
    result = translator.evaluate(
        sources,
        references,
        request,
        hyp_path=args.output,
        lang=lang,
        progress=show_progress(args),
    )
    used: dict[str, Any] = {"shortlist": request.shortlist.origin if request.shortlist else None}
    if request.glossary is not None:  # the terms the outputs hold (the sources' matches)
        found = [len(request.glossary.matches(s)) for s in sources]
        used["glossary"] = {
            "file": args.glossary,
            "terms_applied": sum(found),
            "sentences": sum(1 for n in found if n),
        }
    scored = {**result.as_dict(), "paper_bleu_lang": lang}
    print(json.dumps({**scored, **translator.precision.as_dict(), **used}, indent=2))
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
    p.add_argument(
        "--lang",
        help="target language for the paper BLEU's Moses tokeniser (default: the one the "
        "checkpoint's training data records, else de)",
    )
    add_engine_arg(p)
    add_corpus_args(p)
    add_shortlist_args(p)
    p.set_defaults(func=_evaluate)


def add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate raw text, one line in -> one line out")
    add_decode_args(p, outputs=True, ensemble=True)
    p.add_argument("--input", help="a text file (default: stdin)")
    p.add_argument("--interactive", action="store_true", help="prompt and answer line by line")
    p.add_argument(
        "--split",
        nargs="?",
        const="auto",
        metavar="LANG",
        help="split each line into sentences (Moses' rules for LANG, default the checkpoint's "
        "source language), translate them, join them back: one line out per line in, long "
        "sentences cut at clause punctuation (docs/documents.md)",
    )
    _add_markup_args(p)
    add_engine_arg(p)
    add_corpus_args(p, window=True)
    add_shortlist_args(p)
    p.set_defaults(func=_translate)


def _add_markup_args(p: argparse.ArgumentParser) -> None:
    """--markup, --placeholders, --placeholder-pattern (aiayn.text.markup)."""
    p.add_argument(
        "--markup",
        choices=["xml", "html"],
        help="the lines carry tags: keep them out of the model and put them back around the "
        "aligned words; the output is well formed when the input was (docs/documents.md)",
    )
    p.add_argument(
        "--placeholders",
        action="store_true",
        help="keep printf and brace format strings, URLs, e-mail addresses, numbers and "
        "entities out of the model and put them back verbatim",
    )
    p.add_argument(
        "--placeholder-pattern",
        action="append",
        metavar="REGEX",
        help="also keep what REGEX matches verbatim (may repeat)",
    )


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
