"""``aiayn parse prepare|train|evaluate|parse``: constituency parsing as translation (Table 4).

aiayn parse prepare --treebank ../shared/data/ptb-wsj-sample --out work/ptb-sample
aiayn parse train parsing-sample
aiayn average runs/parsing-sample/checkpoints --last 5 --out runs/parsing-sample/averaged
aiayn parse evaluate --checkpoint runs/parsing-sample/averaged --data work/ptb-sample --split test
echo "The dog barks ." | aiayn parse parse --checkpoint runs/parsing-sample/averaged
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import get_args

from ..parsing.linearize import Leaves  # torch-free
from .common import add_threads_arg, say_wrote, set_threads
from .decoding import add_decode_args, decode_config
from .train import add_train_args, run_training

SAMPLE_VOCAB, FULL_VOCAB = 4000, 16000  # see docs/parsing.md; 16K is the paper's (WSJ only)


def _prepare(args: argparse.Namespace) -> None:
    from ..parsing import split_wsj, split_wsj_sample
    from ..parsing.pipeline import prepare_parsing

    if (args.treebank is None) == (args.wsj_root is None):
        raise SystemExit("aiayn parse prepare: give exactly one of --treebank and --wsj-root")
    if args.treebank is not None:
        split, default_vocab = split_wsj_sample(args.treebank), SAMPLE_VOCAB
    else:
        split, default_vocab = split_wsj(args.wsj_root), FULL_VOCAB
    summary = prepare_parsing(
        split.train,
        split.dev,
        split.test,
        args.out,
        vocab_size=args.vocab_size or default_vocab,
        max_len=args.max_len,
        leaves=args.leaves,
    )
    print(json.dumps(summary, indent=2))
    say_wrote("parse prepare", args.out)


def _train(args: argparse.Namespace) -> None:
    run_training(args, "parse train", preset="parsing-cpu")


def _evaluate(args: argparse.Namespace) -> None:
    from ..parsing.pipeline import evaluate_parser

    set_threads(args)
    result = evaluate_parser(
        args.checkpoint,
        args.data,
        args.split,
        decode_config(args),
        limit=args.limit,
        out_dir=args.out,
        device=args.device,
        progress=True,
        constrained=args.constrained,
    )
    print(json.dumps(result, indent=2))
    say_wrote("parse evaluate", result["predictions"], result["report"])


def _parse(args: argparse.Namespace) -> None:
    from ..files import iter_lines
    from ..parsing.pipeline import parse_lines

    set_threads(args)
    lines = list(iter_lines(args.input) if args.input else iter_lines(sys.stdin.buffer, "<stdin>"))
    for tree in parse_lines(
        args.checkpoint,
        lines,
        decode_config(args),
        device=args.device,
        constrained=args.constrained,
        leaves=args.leaves,
    ):
        print(tree)


def add_parse(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="constituency parsing on Penn Treebank files (Table 4)")
    cmds = p.add_subparsers(dest="parse_command", required=True)
    _add_prepare(cmds)

    c = cmds.add_parser("train", help="the ordinary trainer; default preset parsing-cpu")
    add_train_args(
        c,
        recipe="parsing-sample",
        set_example="max_minutes=30",
        resume_help="checkpoint to resume from (default: latest in OUT)",
    )
    c.set_defaults(func=_train)

    c = cmds.add_parser("evaluate", help="beam-parse dev/test and score with EVALB (COLLINS.prm)")
    add_decode_args(c, preset="parsing")
    add_threads_arg(c)
    c.add_argument("--data", required=True, help="directory written by 'aiayn parse prepare'")
    c.add_argument("--split", default="test", choices=["dev", "test"])
    c.add_argument("--limit", type=int, help="the first N sentences only")
    c.add_argument("--out", help="where SPLIT.parsed and SPLIT.evalb go (default: the checkpoint)")
    c.set_defaults(func=_evaluate)

    c = cmds.add_parser("parse", help="tokenised sentences (stdin) -> bracketed trees (stdout)")
    add_decode_args(c, preset="parsing")
    add_threads_arg(c)
    c.add_argument("--input", help="a file of sentences, one a line (default: stdin)")
    c.add_argument(
        "--leaves",
        choices=get_args(Leaves),
        help="as the model's training data was prepared (aiayn parse prepare --leaves); "
        "default: what the checkpoint records, XX for checkpoints that record none",
    )
    c.set_defaults(func=_parse)


def _add_prepare(cmds: argparse._SubParsersAction) -> None:
    """``aiayn parse prepare``: a treebank as the trainer's parallel data."""
    c = cmds.add_parser(
        "prepare", help="treebank -> parallel text, gold trees, vocabulary, binarised data"
    )
    c.add_argument(
        "--treebank",
        help="NLTK's WSJ sample: wsj_0001.mrg .. wsj_0199.mrg (0001-0179 train, "
        "0180-0189 dev, 0190-0199 test)",
    )
    c.add_argument(
        "--wsj-root", help="the full treebank, ROOT/NN/wsj_NNxx.mrg (02-21 train, 22 dev, 23 test)"
    )
    c.add_argument("--out", required=True, help="dataset directory to write")
    c.add_argument(
        "--vocab-size",
        type=int,
        help=f"default {SAMPLE_VOCAB} for the sample, {FULL_VOCAB} (the paper's) for the full WSJ",
    )
    c.add_argument(
        "--max-len", type=int, help="skip pairs longer than this many subwords (default: keep all)"
    )
    c.add_argument(
        "--leaves",
        choices=get_args(Leaves),
        default="XX",
        help="what a preterminal becomes in the target: XX (the paper's), or (options) the word "
        "itself (the 30-minute CPU recipe), a word-index marker <i>, or its POS tag",
    )
    c.set_defaults(func=_prepare)
