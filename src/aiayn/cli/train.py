"""``aiayn train`` (the paper's recipe, torchrun for several processes) and ``aiayn average``
(checkpoint averaging, section 6.1)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ..errors import UserError
from .common import add_device_arg, say_wrote


def add_train_args(
    p: argparse.ArgumentParser, recipe: str, set_example: str, resume_help: str
) -> None:
    """The options of a training command: a config (``recipe`` names a bundled one), overrides,
    resumption and the device."""
    p.add_argument(
        "config",
        nargs="?",
        help=f"YAML/TOML/JSON file of TrainConfig keys, or a bundled recipe: {recipe}",
    )
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help=f"override, e.g. {set_example}"
    )
    p.add_argument("--resume", default="auto", help=resume_help)
    p.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="fine-tune: start a new run from this checkpoint's weights (its vocabulary: "
        "prepare the new text with --vocab CHECKPOINT); OUT's own latest "
        "checkpoint, when there is one, is resumed instead",
    )
    p.add_argument(
        "--init-from-keep",
        metavar="PARTS",
        help="also carry over its optimizer, schedule or both (optimizer,schedule); "
        "default: fresh ones",
    )
    add_device_arg(p, default="auto")


def run_training(args: argparse.Namespace, command: str, **defaults: str) -> None:
    """Train as ``add_train_args`` parsed (``defaults``: TrainConfig keys, e.g. the preset, that
    a config and ``--set`` override); the main process prints the summary, the run's cost
    against the matmul peak measured here, and where it wrote.

    SIGTERM or Ctrl-C stops the run after the update in progress with a checkpoint, one line
    saying where and how to resume, and the exit status a shell gives the signal (143, 130).
    """
    from ..train.preemption import exit_code
    from ..workflow import train_model

    def say_stopped(summary: dict[str, Any]) -> None:
        print(_stopped_line(args, command, summary), file=sys.stderr)

    run = train_model(
        args.config,
        overrides=args.set or [],
        resume=args.resume,
        device=args.device,
        init_from=args.init_from,
        init_from_keep=args.init_from_keep,
        on_stopped=say_stopped,
        **defaults,
    )
    if run.stopped is not None:
        raise SystemExit(exit_code(run.stopped))
    if run.main:
        print(run.json())
        say_wrote(command, run.out)


def _stopped_line(args: argparse.Namespace, command: str, summary: dict[str, Any]) -> str:
    """``aiayn train: stopped by SIGTERM at update N, checkpoint PATH; resume: COMMAND``."""
    saved = summary["checkpoint"] or "nothing saved (no update yet)"
    return (
        f"aiayn {command}: stopped by {summary['stopped']} at update {summary['updates']}, "
        f"checkpoint {saved}; resume: {resume_command(args, command)}"
    )


def resume_command(args: argparse.Namespace, command: str) -> str:
    """The command line that carries on a training run: its own options without ``--resume``,
    so that it takes OUT's latest checkpoint; under torchrun, launched as it was (on several
    nodes, the rendezvous endpoint is left for the user to fill in: HOST:PORT)."""
    argv = ["aiayn", *command.split(), *([args.config] if args.config else [])]
    for item in args.set or []:
        argv += ["--set", item]
    for option in ("init_from", "init_from_keep"):
        if getattr(args, option) is not None:
            argv += ["--" + option.replace("_", "-"), getattr(args, option)]
    argv += ["--device", args.device]
    world, local = int(os.environ.get("WORLD_SIZE", "1")), os.environ.get("LOCAL_WORLD_SIZE")
    if world == 1:
        return shlex.join(argv)
    launch = ["torchrun", "--nproc_per_node", local or str(world)]
    if local is not None and int(local) != world:  # several nodes: on each, with its rendezvous
        nodes = str(world // int(local))
        launch += ["--nnodes", nodes, "--rdzv_backend", "c10d", "--rdzv_endpoint", "HOST:PORT"]
    return shlex.join([*launch, "-m", *argv])


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
