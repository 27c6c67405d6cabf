"""``aiayn prepare`` (a corpus -> shared BPE vocabulary and binarised data) and ``aiayn info``
(the presets' parameter counts)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UserError
from .common import say_wrote, show_progress

DEFAULT_VOCAB_SIZE = 8000


def _info(args: argparse.Namespace) -> None:
    from ..analysis.info import preset_table

    print(preset_table())


def _prepare(args: argparse.Namespace) -> None:
    from ..data import bundled_corpus_paths, prepare_corpus
    from ..data.prepare import BIBLE_LANGS

    record = None  # the languages, where this command knows them (validation BLEU reads them)
    if args.bundled:
        splits, record = bundled_corpus_paths(), BIBLE_LANGS
    elif args.wmt14:
        from ..data.prepare import check_target
        from ..data.wmt import download_wmt14

        check_target(Path(args.out))  # before hours of downloading
        src, tgt = args.wmt14.split("-")[1], args.wmt14.split("-")[0]  # "de-en" -> en->de
        splits = download_wmt14(args.wmt14, src, tgt, Path(args.out) / "raw")
        record = {"src_lang": src, "tgt_lang": tgt}
    else:
        if not (args.train_src and args.train_tgt):
            raise UserError("no input: give --bundled, --wmt14, or --train-src and --train-tgt")
        splits = {"train": (Path(args.train_src), Path(args.train_tgt))}
        for name in ("valid", "test"):
            src, tgt = getattr(args, f"{name}_src"), getattr(args, f"{name}_tgt")
            if src and tgt:
                splits[name] = (Path(src), Path(tgt))
    if args.vocab and args.vocab_size is not None:
        raise UserError("--vocab reuses a vocabulary of its own size: give it or --vocab-size")
    summary = prepare_corpus(
        splits,
        args.out,
        vocab_size=DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
        max_len=args.max_len,
        vocab=args.vocab,
        workers=args.workers,
        record=record,
    )
    print(json.dumps(summary, indent=2))
    say_wrote("prepare", args.out)


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="presets and their parameter counts")
    p.add_argument("--presets", action="store_true", help="the Table 3 parameter-count table")
    p.set_defaults(func=_info)


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="train the shared BPE vocabulary and binarise a corpus")
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--bundled", action="store_true", help="the bundled English->Spanish Bible")
    p.add_argument(
        "--wmt14",
        choices=["de-en", "fr-en"],
        help="download WMT14 (English->German/French) with Hugging Face datasets (pip install -e '.[wmt]')",
    )
    for split in ("train", "valid", "test"):
        p.add_argument(f"--{split}-src")
        p.add_argument(f"--{split}-tgt")
    p.add_argument("--vocab-size", type=int, help=f"default: {DEFAULT_VOCAB_SIZE}")
    p.add_argument(
        "--vocab",
        metavar="VOCAB",
        help="binarise with this vocabulary instead of training one: a SentencePiece model, or "
        "a CHECKPOINT directory (its spm.model, or an imported model's source and target "
        "models), to fine-tune that checkpoint on the new text",
    )
    p.add_argument(
        "--max-len", type=int, default=256, help="skip pairs longer than this (subwords)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that binarise (the files are the same whatever the number; default: 1)",
    )
    p.set_defaults(func=_prepare)


def _shortlist(args: argparse.Namespace) -> None:
    from ..data.lexical import FORMAT, build_shortlist, shortlist_text
    from ..files import check_output_file, write_text_atomic

    for option, value, least in (
        ("--iterations", args.iterations, 1),
        ("--max-pairs", args.max_pairs, 1),
        ("--frequent", args.frequent, 0),
        ("--best", args.best, 0),
    ):
        if value < least:
            raise UserError(f"{option} must be at least {least}, got {value}")
    if not 0.0 <= args.threshold <= 1.0:
        raise UserError(f"--threshold is a probability, between 0 and 1: got {args.threshold}")
    out = check_output_file(args.out or Path(args.data) / "shortlist.json")
    if out.exists():  # ours (a shortlist) is replaced; anything else is not
        with open(out, "rb") as f:
            head = f.read(200).decode("utf-8", errors="replace")
        if f'"format": "{FORMAT}"' not in head:
            remedy = "choose another --out" if args.out else "give --out FILE to write elsewhere"
            raise UserError(f"{out} exists and is not a shortlist; not replacing it ({remedy})")
    built = build_shortlist(
        args.data,
        iterations=args.iterations,
        max_pairs=args.max_pairs,
        frequent=args.frequent,
        best=args.best,
        threshold=args.threshold,
        progress=show_progress(args),
    )
    write_text_atomic(out, shortlist_text(built))
    print(
        f"{len(built['frequent'])} frequent target pieces, {len(built['lexical'])} source "
        f"pieces with translations, from {built['built_from']['pairs']} pairs"
    )
    say_wrote("shortlist", out)


def add_shortlist(sub: argparse._SubParsersAction) -> None:
    from ..data.lexical import ITERATIONS, KEEP_BEST, KEEP_FREQUENT, MAX_PAIRS, THRESHOLD

    p = sub.add_parser(
        "shortlist",
        help="the vocabulary shortlist of a prepared dataset, for translate --shortlist",
        description="IBM Model 1 translation probabilities of the training pairs, and the "
        "target side's most frequent pieces: what translate/evaluate --shortlist reads.",
    )
    p.add_argument("--data", required=True, help="a dataset directory from aiayn prepare")
    p.add_argument("--out", help="the file to write (default: DATA/shortlist.json)")
    p.add_argument("--iterations", type=int, default=ITERATIONS, help="EM iterations")
    p.add_argument(
        "--max-pairs",
        type=int,
        default=MAX_PAIRS,
        help="estimate from the first N training pairs (memory: ~90 bytes per source x "
        "target position of a pair)",
    )
    p.add_argument("--frequent", type=int, default=KEEP_FREQUENT, help="frequent pieces kept")
    p.add_argument("--best", type=int, default=KEEP_BEST, help="translations kept per piece")
    p.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="translations kept need t >= this"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (shown on a terminal)")
    p.set_defaults(func=_shortlist)
