"""``aiayn measure``: this machine's figures for every ``auto`` (``aiayn.analysis.measure``), written into
its own table, which ``auto`` reads before the package's."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from ..errors import UserError


def _measure(args: argparse.Namespace) -> None:
    import torch

    from ..analysis import measure
    from ..runtime import figures, hardware
    from ..runtime.cpu import cpu_description

    plan = measure.Plan(
        data=Path(args.data),
        updates=args.updates or measure.DEFAULT_UPDATES.get(args.setting, 0),
        threads=args.threads or torch.get_num_threads(),
        preset=args.preset,
        warm=args.warm,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        sentences=args.sentences,
        attention=args.attention,
    )
    torch.set_num_threads(plan.threads)
    support = hardware.bf16_support(torch.device("cpu"))
    if args.setting != "compile" and not support.native:
        raise UserError(f"{args.setting}: {support.reason}, where auto never chooses bf16")
    print(f"{args.setting} on {cpu_description()} ({support.chip}), {plan.threads} threads")
    with tempfile.TemporaryDirectory(prefix="aiayn-measure-") as work:
        figure = measure.measure(args.setting, plan, Path(work))
    if args.setting == "decode_bf16":  # the choice it measured, recorded in its command
        plan = dataclasses.replace(plan, attention=figure["attention"])
    table = Path(args.table)
    measure.record(table, support.chip, args.setting, figure, measure.command(args.setting, plan))
    decision = figures.decide(args.setting, support.chip, table)
    print(f"{table}: {support.chip} {args.setting} = {figure}")
    print(f"auto: {'on' if decision.on else 'off'}: {decision.reason}")


def _count(text: str) -> int:
    """A count an option gives (updates, threads, sentences): 0 would silently mean the
    default, and a negative one fails after the training it waits for."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def add_measure(sub: argparse._SubParsersAction) -> None:
    from ..runtime.figures import SETTINGS, user_table

    p = sub.add_parser(
        "measure",
        help="measure this machine's figures for amp/--precision/compile auto",
        description="Measure the figures that amp: auto (train_bf16), --precision auto "
        "(decode_bf16), compile: auto (compile) and bf16 training's attention path "
        "(train_bf16_matmul_attention) decide from on this machine, and write them "
        "into its own table, which auto reads before the package's. Run it with nothing else on "
        "the machine: a second job changes the speed ratios. The bf16 settings are refused on a "
        "CPU without native bf16, where auto never chooses bf16. `--preset tiny --updates 3` "
        "checks the command in seconds.",
    )
    p.add_argument("setting", choices=SETTINGS)
    p.add_argument(
        "--table",
        default=str(user_table()),
        help="the table to write (default: this machine's, $AIAYN_MEASURED or the user's cache; "
        "src/aiayn/runtime/figures.json: the package's)",
    )
    p.add_argument(
        "--data", default="work/bible", help="the prepared bundled corpus (prepared if absent)"
    )
    p.add_argument(
        "--updates", type=_count, help="per run (train_bf16 100, compile 40, the attention 100)"
    )
    p.add_argument(
        "--warm",
        type=_count,
        default=5,
        help="compile and train_bf16_matmul_attention: updates before the steady rate",
    )
    p.add_argument("--preset", help="a model preset in place of the demo's (tiny: a check)")
    p.add_argument("--threads", type=_count, help="(default: torch's)")
    p.add_argument("--checkpoint", help="decode_bf16: the demo model")
    p.add_argument("--sentences", type=_count, help="decode_bf16: the first N test verses")
    p.add_argument(
        "--attention",
        choices=["fp32", "bf16"],
        help="decode_bf16: what the bf16 model's decoder attention computes in (default: the "
        "chip's current choice)",
    )
    p.set_defaults(func=_measure)
