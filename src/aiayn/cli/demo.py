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


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="train + evaluate an English->Spanish translator on the bundled corpus"
    )
    p.add_argument("--minutes", type=float, default=15.0, help="training budget (wall clock)")
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
