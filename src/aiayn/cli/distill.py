"""``aiayn distill``: a small, fast student from a teacher in one command (``aiayn.distill``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .common import add_threads_arg, say_wrote, set_threads, show_progress
from .decoding import workers_arg
from .stopping import one_line_on_signal


def _distill(args: argparse.Namespace) -> None:
    from ..demo import TrainingStopped
    from ..distill import Budget, Teaching, run_distill
    from ..distill.corpus import Filter
    from ..train.preemption import exit_code

    set_threads(args)
    budget = Budget(
        student_updates=args.student_updates,
        minutes=args.minutes,
        teacher_limit=args.teacher_limit,
        test_limit=args.test_limit,
        speed_limit=args.speed_limit,
    )
    teaching = Teaching(
        beam=args.beam,
        nbest=args.nbest,
        select=args.select,
        keep=Filter(max_ppl=args.max_ppl, drop_worst=args.drop_worst),
        workers=args.workers,
    )
    again = "run the same command again to continue (what is done is kept)"
    try:
        with one_line_on_signal("distill", again):
            report = run_distill(
                args.teacher,
                args.data,
                args.out,
                student=args.student,
                sets=args.set or [],
                budget=budget,
                teaching=teaching,
                record=Path(args.record) if args.record else None,
                command=_command(args),
                bars=show_progress(args.quiet),
            )
    except TrainingStopped as stop:
        saved = stop.checkpoint or "nothing saved (no update yet)"
        print(f"aiayn distill: {stop}, checkpoint {saved}; {again}", file=sys.stderr)
        raise SystemExit(exit_code(stop.signal_name)) from None
    from ..distill.report import summary_figures

    for name, value in summary_figures(report).items():
        print(f"{name:<30} {value}")
    say_wrote("distill", args.out)


# the options a record's command names when they differ from these defaults
DEFAULTS = {
    "student": "student-demo",
    "student_updates": None,
    "minutes": None,
    "teacher_limit": None,
    "test_limit": None,
    "speed_limit": 200,
    "beam": None,
    "nbest": 1,
    "select": "model",
    "max_ppl": None,
    "drop_worst": 0.0,
    "workers": "auto",
    "threads": None,
}


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this run again (a record's ``command``)."""
    words = ["aiayn", "distill", *args.teacher, "--data", args.data, "--out", args.out]
    for key, default in DEFAULTS.items():
        if getattr(args, key) != default:
            words += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    for item in args.set or []:
        words += ["--set", item]
    return shlex.join(words)


def add_distill(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distill",
        help="a small, fast student trained on a teacher's translations of the training data",
        description="The teacher translates the training sources (resumable), its outputs are "
        "chosen and filtered, prepared with its vocabulary, a student preset trains on them, "
        "and both are evaluated side by side (BLEU and chrF with intervals, the paired test, "
        "decoding speed in fp32/int8, with and without the shortlist, 1 and 2 threads).",
    )
    p.add_argument("teacher", nargs="+", help="the teacher's checkpoint (several: an ensemble)")
    p.add_argument("--data", required=True, help="the teacher's prepared dataset (aiayn prepare)")
    p.add_argument("--out", required=True, help="the run directory (a re-run continues it)")
    p.add_argument("--student", default="student-demo", help="the student's preset")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--student-updates", type=int, help="the student's training updates")
    budget.add_argument("--minutes", type=float, help="the student's training minutes instead")
    p.add_argument("--teacher-limit", type=int, help="translate the first N training pairs only")
    p.add_argument("--test-limit", type=int, help="evaluate on the first N test sentences only")
    p.add_argument(
        "--speed-limit", type=int, default=200, help="test sentences of each timed form (200)"
    )
    p.add_argument("--beam", type=int, help="the teacher's beam (default: the paper's 4)")
    p.add_argument("--nbest", type=int, default=1, help="hypotheses the teacher keeps (1)")
    p.add_argument(
        "--select",
        choices=["model", "chrf", "bleu"],
        default="model",
        help="of the n-best: the teacher's best, or the best by sentence chrF/BLEU against "
        "the reference",
    )
    p.add_argument(
        "--max-ppl", type=float, help="drop pairs the teacher scores above this perplexity"
    )
    p.add_argument(
        "--drop-worst", type=float, default=0.0, help="drop this share with the lowest log-prob"
    )
    p.add_argument("--workers", type=workers_arg, default="auto", help="teacher decoding processes")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="the student's training")
    p.add_argument("--record", metavar="DIR", help="write the records here (default: OUT/records)")
    add_threads_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_distill)
