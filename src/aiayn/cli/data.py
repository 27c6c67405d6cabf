"""``aiayn prepare`` (a corpus -> shared BPE vocabulary and binarised data) and ``aiayn info``
(the presets' parameter counts)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..errors import UserError
from ..workflow import DEFAULT_VOCAB_SIZE
from .common import say_wrote, show_progress
from .stopping import one_line_on_signal


def _info(args: argparse.Namespace) -> None:
    from ..analysis.info import preset_table

    print(preset_table())


def _prepare(args: argparse.Namespace) -> None:
    from ..workflow import prepare

    corpora = None if args.bundled or args.wmt14 else _own_splits(args)  # may read languages
    languages, cleaning = _prepare_options(args)
    again = (
        f"nothing written to {args.out} (a dataset already there is unchanged); run the same "
        "command again to prepare it"
    )
    with one_line_on_signal("prepare", again):  # temporary files go in the finally blocks
        written = prepare(
            args.out,
            bundled=args.bundled,
            wmt14=args.wmt14,
            corpora=corpora,
            src_lang=languages[0],
            tgt_lang=languages[1],
            cleaning=cleaning,
            valid_size=args.valid_size,
            test_size=args.test_size,
            seed=args.seed,
            vocab_size=args.vocab_size,
            vocab=args.vocab,
            max_len=args.max_len,
            workers=args.workers,
            progress=show_progress(args.quiet),
        )
    for line in summary_lines(written.summary):
        print(f"aiayn prepare: {line}", file=sys.stderr)
    print(written.json())
    say_wrote("prepare", args.out)


def _prepare_options(args: argparse.Namespace):
    """((source, target) languages, cleaning filters) of ``prepare``'s options."""
    from ..data.clean import Cleaning

    if args.no_clean:
        cleaning = Cleaning.off()
    else:
        cleaning = Cleaning(
            ratio=args.ratio or None,
            copies=not args.keep_copies,
            duplicates=not args.keep_duplicates,
            remove_overlap=not args.keep_overlap,
            langid=args.langid,
        )
    if args.max_words is not None:
        cleaning = dataclasses.replace(cleaning, max_words=args.max_words)
    return (args.src_lang, args.tgt_lang), cleaning


def _own_splits(args: argparse.Namespace) -> dict:
    """The corpora of each split: a data spec file, ``--corpus`` options, and the per-split
    file options, together (``workflow.prepare`` checks what is missing or too much)."""
    from ..data.corpora import Corpus, data_spec, parse_corpus_option
    from ..train.config import read_config_file

    splits: dict[str, list[Corpus]] = {}
    if args.data_spec:
        spec, langs = data_spec(read_config_file(args.data_spec), Path(args.data_spec))
        splits.update(spec)
        args.src_lang, args.tgt_lang = args.src_lang or langs.src, args.tgt_lang or langs.tgt
    for i, text in enumerate(args.corpus or []):
        splits.setdefault("train", []).append(parse_corpus_option(text, i))
    for split in ("train", "valid", "test"):
        src, tgt = getattr(args, f"{split}_src"), getattr(args, f"{split}_tgt")
        if bool(src) != bool(tgt):
            raise UserError(f"--{split}-src and --{split}-tgt go together: give both")
        given = {"src": src, "tgt": tgt} if src else {}
        for kind in ("tsv", "tmx"):
            if getattr(args, f"{split}_{kind}"):
                given[kind] = getattr(args, f"{split}_{kind}")
        if given:
            where = " ".join(f"--{split}-{k}" for k in given)
            splits.setdefault(split, []).append(Corpus.from_dict(given, where, split))
    return splits


def summary_lines(summary: dict) -> list[str]:
    """One line per split (what was read, kept and dropped by which filter) and one for the
    overlap of valid/test with train."""
    lines = []
    for split, counts in summary["splits"].items():
        dropped = {**counts.get("cleaning", {})}
        for key in ("empty", "too_long_words", "invalid_utf8"):
            dropped.setdefault(key, counts.get(f"skipped_{key}", 0))
        dropped["too_long_subwords"] = counts["skipped_too_long_tokens"]
        shown = ", ".join(f"{n} {k}" for k, n in dropped.items() if n)
        lines.append(
            f"{split}: {counts['pairs']} of {counts['read']} pairs kept"
            + (f"; dropped {shown}" if shown else "")
        )
    overlap = summary["splits"]["train"].get("overlap")
    if overlap:
        found = ", ".join(
            f"{v['found_in_train']} of {v['pairs']} {s} pairs"
            for s, v in overlap["held_out"].items()
        )
        lines.append(
            f"overlap with train (pair or source, exact or normalised): {found}; "
            f"{summary['splits']['train'].get('cleaning', {}).get('overlap', 0)} training pairs removed"
        )
    if "tgt_lang" not in summary.get("record", {}):
        lines.append(
            "no target language recorded (give --src-lang/--tgt-lang or files named .LANG): "
            "training with validation BLEU will need valid_bleu_lang"
        )
    return lines


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="presets and their parameter counts")
    p.add_argument("--presets", action="store_true", help="the Table 3 parameter-count table")
    p.set_defaults(func=_info)


def _add_cleaning_args(p: argparse.ArgumentParser) -> None:
    """``prepare``'s held-out, overlap and cleaning options (docs/data.md)."""
    from ..data.clean import RATIO

    held = p.add_argument_group("held-out splits and overlap")
    held.add_argument("--valid-size", type=int, default=0, help="carve N valid pairs from train")
    held.add_argument("--test-size", type=int, default=0, help="carve N test pairs from train")
    held.add_argument("--seed", type=int, default=1, help="the draw of --valid/test-size")
    held.add_argument(
        "--keep-overlap",
        action="store_true",
        help="count training pairs whose pair or source is in valid/test, but keep them",
    )
    clean = p.add_argument_group("cleaning (training corpora; valid/test lose empty pairs only)")
    clean.add_argument(
        "--ratio",
        type=float,
        default=RATIO,
        help="drop pairs where one side has more than RATIO times the other's words, as Moses "
        f"clean-corpus-n.perl -ratio (default: {RATIO:g}, its own; fairseq uses 1.5; 0: off)",
    )
    clean.add_argument("--max-words", type=int, help="drop pairs over this many words a side")
    clean.add_argument("--keep-duplicates", action="store_true", help="keep repeated pairs")
    clean.add_argument(
        "--keep-copies", action="store_true", help="keep pairs with source == target"
    )
    clean.add_argument(
        "--langid",
        action="store_true",
        help="drop pairs whose sides are not in --src-lang/--tgt-lang (py3langid; pip install py3langid)",
    )
    clean.add_argument(
        "--no-clean", action="store_true", help="only empty and invalid UTF-8 pairs are dropped"
    )


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="clean a corpus, train the shared BPE vocabulary and binarise it",
        description="Your own corpus: plain pairs, TSV or TMX files (.gz too), several named "
        "training corpora with weights (--corpus, --data-spec), cleaned (counts in meta.json), "
        "with valid/test carved out and checked against train. docs/data.md is the guide.",
    )
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--bundled", action="store_true", help="the bundled English->Spanish Bible")
    p.add_argument(
        "--wmt14",
        choices=["de-en", "fr-en"],
        help="download WMT14 (English->German/French) with Hugging Face datasets (pip install -e '.[wmt]')",
    )
    for split in ("train", "valid", "test"):
        p.add_argument(f"--{split}-src", help=f"{split} source sentences, one a line")
        p.add_argument(f"--{split}-tgt", help=f"{split} target sentences, line-aligned")
        p.add_argument(f"--{split}-tsv", help=f"{split} pairs as source<TAB>target lines")
        p.add_argument(f"--{split}-tmx", help=f"{split} pairs from a TMX translation memory")
    p.add_argument(
        "--corpus",
        action="append",
        metavar="KEY=VALUE,...",
        help="a named training corpus: name=N and src=F,tgt=F or tsv=F or tmx=F, optional "
        "weight=W (sampled W times as often per epoch), back_translated=true and tag=LANG (its "
        "sources start with >>LANG<<: one model, several target languages) (repeatable)",
    )
    p.add_argument(
        "--data-spec", metavar="FILE", help="YAML/JSON file naming the corpora of each split"
    )
    p.add_argument("--src-lang", help="source language code (default: the files' .LANG suffix)")
    p.add_argument("--tgt-lang", help="target language code (default: the files' .LANG suffix)")
    _add_cleaning_args(p)
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
    p.add_argument("--quiet", action="store_true", help="no progress bars (shown on a terminal)")
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
        progress=show_progress(args.quiet),
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
