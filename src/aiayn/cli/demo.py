"""``aiayn demo``: prepare, train, average and evaluate the bundled English->Spanish translator
(``aiayn.demo``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import say_wrote
from .stopping import one_line_on_signal


def _demo(args: argparse.Namespace) -> None:
    from ..demo import TrainingStopped, format_report, run_demo
    from ..train.preemption import exit_code

    again = "run the same command again to continue (the corpus and checkpoints are kept)"
    try:
        with one_line_on_signal("demo", again):  # training sets its own handlers, which save
            report = run_demo(
                minutes=args.minutes,
                updates=args.updates,
                record=Path(args.record) if args.record else None,
                work=Path(args.work),
                out=Path(args.out),
                sets=args.set or [],
                test_limit=args.test_limit,
                fresh=args.fresh,
            )
    except TrainingStopped as stop:
        saved = stop.checkpoint or "nothing saved (no update yet)"
        print(f"aiayn demo: {stop}, checkpoint {saved}; {again}", file=sys.stderr)
        raise SystemExit(exit_code(stop.signal_name)) from None
    print(format_report(report))
    say_wrote("demo", args.work, args.out)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="train + evaluate an English->Spanish translator on the bundled corpus"
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--updates",
        type=_positive_int,
        help="training updates (default: aiayn.demo.DEMO_UPDATES, 2,200: about 15 minutes on 2 "
        "laptop cores); the same number gives the same BLEU on every CPU",
    )
    budget.add_argument(
        "--minutes",
        type=_positive_float,
        help="stop on the wall clock after this many minutes of training instead (the updates, "
        "and the BLEU, then depend on the machine)",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help="write the run's record (aiayn.records) into DIR, e.g. records/ of a clone "
        "(default: the run directory's records/)",
    )
    p.add_argument("--work", default="work/bible", help="where the prepared corpus goes")
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="TrainConfig override of the demo's recipe, e.g. model.P_drop=0.1 "
        "(not out or data: use --out, --work)",
    )
    p.add_argument("--test-limit", type=int, help="evaluate on the first N test sentences only")
    p.add_argument(
        "--fresh", action="store_true", help="delete the run directory first (only one a demo made)"
    )
    p.set_defaults(func=_demo)
