"""``aiayn train`` (the paper's recipe, torchrun for several processes) and ``aiayn average``
(checkpoint averaging, section 6.1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UserError
from .common import add_train_args, run_training


def _train(args: argparse.Namespace) -> None:
    run_training(args, "train")


def _average(args: argparse.Namespace) -> None:
    import warnings

    from ..checkpoint.averaging import (
        average_checkpoints,
        checkpoint_label,
        choose_best,
        choose_last,
        ema_of,
    )

    if args.best is not None and args.choose_on:
        raise UserError("--choose-on chooses among the last checkpoints: give --last, not --best")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.best is not None:
            chosen = choose_best(Path(args.checkpoints), args.best)
        else:
            chosen = choose_last(Path(args.checkpoints), 5 if args.last is None else args.last)
    for warning in caught:
        print(f"aiayn average: warning: {warning.message}", file=sys.stderr)
    if args.ema:
        chosen = ema_of(chosen)
    if args.choose_on:
        from ..checkpoint.averaging import average_last_best, check_average_out
        from ..evaluate import perplexity_on, read_test_pair

        check_average_out(Path(args.out), [*chosen, *map(Path, args.choose_on)], args.force)
        sources, references = read_test_pair(*args.choose_on)
        out, k_best, ppl_by_k = average_last_best(
            chosen, Path(args.out), perplexity_on(sources, references), force=args.force
        )
        print(
            "validation perplexity by number averaged: "
            + ", ".join(f"{k}: {ppl:.3f}" for k, ppl in ppl_by_k.items())
        )
        chosen = chosen[-k_best:]
    else:
        out = average_checkpoints(chosen, Path(args.out), force=args.force)
    labels = [checkpoint_label(p) for p in chosen]
    names = ", ".join(labels) if args.best is not None else f"{labels[0]} .. {labels[-1]}"
    print(f"averaged {len(chosen)} checkpoints ({names}) -> {out.resolve()}")


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train with the paper's recipe (torchrun for several processes)"
    )
    add_train_args(
        p,
        recipe="wmt14-base",
        set_example="model.d_ff=1024",
        resume_help="checkpoint directory to resume from (default: latest in OUT, if any)",
    )
    p.set_defaults(func=_train)


def add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the last N checkpoints (paper: 5 base, 20 big)")
    p.add_argument("checkpoints", help="a run's checkpoints/ directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, help="the newest LAST (default: 5)")
    which.add_argument(
        "--best",
        type=int,
        metavar="K",
        help="the K with the best validation by the run's best_metric (in their meta.json)",
    )
    p.add_argument(
        "--choose-on",
        nargs=2,
        metavar=("SRC", "REF"),
        help="average the last k <= LAST instead, k with the lowest perplexity of REF given SRC",
    )
    p.add_argument(
        "--ema",
        action="store_true",
        help="average the moving averages of their weights (their ema/, training with ema_decay)",
    )
    p.add_argument(
        "--out", required=True, help="a new directory, or a previous averaged checkpoint to replace"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out even if it is not a previous averaged checkpoint",
    )
    p.set_defaults(func=_average)
