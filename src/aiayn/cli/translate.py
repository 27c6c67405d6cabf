"""The commands that run a trained translation checkpoint: ``aiayn translate`` (raw text in,
detokenised text out, streamed), ``aiayn evaluate`` (BLEU and perplexity on a test set) and
``aiayn diagnose`` (does the model read its source?)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import say_wrote, show_progress
from .decoding import (
    add_corpus_args,
    add_decode_args,
    add_engine_arg,
    add_shortlist_args,
    open_decoding,
)


def _translate(args: argparse.Namespace) -> None:
    from .stream import translate_lines

    translator, request = open_decoding(args, "translate")  # every option checked, none loaded
    translate_lines(args, translator, request)


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
        progress=show_progress(args.quiet),
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
