"""``aiayn parse prepare|train|evaluate|parse``: constituency parsing as translation (Table 4).

    aiayn parse prepare --treebank ../shared/data/ptb-wsj-sample --out work/ptb-sample
    aiayn parse train parsing-sample
    aiayn average runs/parsing-sample/checkpoints --last 5 --out runs/parsing-sample/averaged
    aiayn parse evaluate --checkpoint runs/parsing-sample/averaged --data work/ptb-sample --split test
    echo "The dog barks ." | aiayn parse parse --checkpoint runs/parsing-sample/averaged

Handlers import the library lazily so that ``aiayn --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys

from .main import say_wrote

SAMPLE_VOCAB, FULL_VOCAB = 4000, 16000  # see docs/parsing.md; 16K is the paper's (WSJ only)


def _prepare(args: argparse.Namespace) -> None:
    from ..parsing.pipeline import prepare_parsing
    from ..parsing import split_wsj, split_wsj_sample

    if (args.treebank is None) == (args.wsj_root is None):
        raise SystemExit("aiayn parse prepare: give exactly one of --treebank and --wsj-root")
    if args.treebank is not None:
        split, default_vocab = split_wsj_sample(args.treebank), SAMPLE_VOCAB
    else:
        split, default_vocab = split_wsj(args.wsj_root), FULL_VOCAB
    summary = prepare_parsing(split.train, split.dev, split.test, args.out,
                              vocab_size=args.vocab_size or default_vocab, max_len=args.max_len,
                              leaves=args.leaves)
    print(json.dumps(summary, indent=2))
    say_wrote("parse prepare", args.out)


def _train(args: argparse.Namespace) -> None:
    from ..train import distributed, load_train_config
    from ..train.trainer import Trainer

    cfg = load_train_config(args.config, args.set or [], preset="parsing-cpu")
    trainer = Trainer(cfg, device=args.device)
    summary = trainer.run(resume=args.resume)
    if trainer.dist.is_main:
        print(json.dumps(summary, indent=2))
        say_wrote("parse train", cfg.out)
    distributed.teardown()


def _decode_config(args: argparse.Namespace):
    from ..decode import DecodeConfig

    overrides = {k: v for k, v in (("beam", args.beam), ("alpha", args.alpha)) if v is not None}
    return DecodeConfig.preset("parsing", **overrides)


def _evaluate(args: argparse.Namespace) -> None:
    from ..parsing.pipeline import evaluate_parser

    _set_threads(args)
    result = evaluate_parser(args.checkpoint, args.data, args.split, _decode_config(args),
                             limit=args.limit, out_dir=args.out, device=args.device, progress=True,
                             constrained=args.constrained)
    print(json.dumps(result, indent=2))
    say_wrote("parse evaluate", result["predictions"], result["report"])


def _parse(args: argparse.Namespace) -> None:
    from ..io import iter_lines
    from ..parsing.pipeline import parse_lines

    _set_threads(args)
    lines = list(iter_lines(args.input) if args.input else iter_lines(sys.stdin.buffer, "<stdin>"))
    for tree in parse_lines(args.checkpoint, lines, _decode_config(args), device=args.device,
                            constrained=args.constrained, leaves=args.leaves):
        print(tree)


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    p.add_argument("--beam", type=int, help="beam size (paper: 21)")
    p.add_argument("--alpha", type=float, help="GNMT length penalty alpha (paper: 0.3)")
    p.add_argument("--constrained", action="store_true",
                   help="search only well-formed trees with one leaf per word (not in the paper; "
                        "default: the paper's search, then repair)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int,
                   help="CPU threads (default: torch's); 1 is far faster on a busy machine")


def _set_threads(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def add_parse_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="constituency parsing on Penn Treebank files (Table 4)")
    cmds = p.add_subparsers(dest="parse_command", required=True)

    c = cmds.add_parser("prepare", help="treebank -> parallel text, gold trees, vocabulary, binarised data")
    c.add_argument("--treebank", help="NLTK's WSJ sample: wsj_0001.mrg .. wsj_0199.mrg (0001-0179 train, "
                                      "0180-0189 dev, 0190-0199 test)")
    c.add_argument("--wsj-root", help="the full treebank, ROOT/NN/wsj_NNxx.mrg (02-21 train, 22 dev, 23 test)")
    c.add_argument("--out", required=True, help="dataset directory to write")
    c.add_argument("--vocab-size", type=int,
                   help=f"default {SAMPLE_VOCAB} for the sample, {FULL_VOCAB} (the paper's) for the full WSJ")
    c.add_argument("--max-len", type=int, help="skip pairs longer than this many subwords (default: keep all)")
    c.add_argument("--leaves", choices=["XX", "index", "tags", "words"], default="XX",
                   help="what a preterminal becomes in the target: XX (the paper's), or (options) the word "
                        "itself (the 30-minute CPU recipe), a word-index marker <i>, or its POS tag")
    c.set_defaults(func=_prepare)

    c = cmds.add_parser("train", help="the ordinary trainer; default preset parsing-cpu")
    c.add_argument("config", nargs="?", help="YAML/TOML/JSON file of TrainConfig keys, or a bundled recipe: parsing-sample")
    c.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. max_minutes=30")
    c.add_argument("--resume", default="auto", help="checkpoint to resume from (default: latest in OUT)")
    c.add_argument("--device", default="auto", help="cpu, cuda (default: cuda if available)")
    c.set_defaults(func=_train)

    c = cmds.add_parser("evaluate", help="beam-parse dev/test and score with EVALB (COLLINS.prm)")
    _add_decode_args(c)
    c.add_argument("--data", required=True, help="directory written by 'aiayn parse prepare'")
    c.add_argument("--split", default="test", choices=["dev", "test"])
    c.add_argument("--limit", type=int, help="the first N sentences only")
    c.add_argument("--out", help="where SPLIT.parsed and SPLIT.evalb go (default: the checkpoint)")
    c.set_defaults(func=_evaluate)

    c = cmds.add_parser("parse", help="tokenised sentences (stdin) -> bracketed trees (stdout)")
    _add_decode_args(c)
    c.add_argument("--input", help="a file of sentences, one a line (default: stdin)")
    c.add_argument("--leaves", choices=["XX", "index", "tags", "words"], default="XX",
                   help="as the model's training data was prepared (aiayn parse prepare --leaves)")
    c.set_defaults(func=_parse)
