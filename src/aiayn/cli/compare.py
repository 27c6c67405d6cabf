"""``aiayn compare``: several systems' outputs on one test set, with intervals and the paired
significance of each difference against the first (``aiayn.analysis.compare``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import say_wrote


def _compare(args: argparse.Namespace) -> None:
    from ..analysis.compare import compare, compare_runs, format_report, read_systems

    systems, outputs, references = read_systems(args.systems, args.ref)
    chart = Path(args.chart) if args.chart else None
    inputs = [Path(args.ref), *(s.hypotheses for s in systems)]
    runs = compare_runs(systems, chart, inputs)  # before the tests: a bad --chart fails at once
    report = compare(
        systems,
        outputs,
        references,
        metrics=args.metrics,
        sentence_metric=args.sentence_metric,
        bootstrap=args.bootstrap,
        trials=args.trials,
    )
    if runs["runs"]:
        report["runs"] = runs
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else format_report(report))
    if chart is not None:
        say_wrote("compare", chart)


def _at_least(low: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="two or more systems' outputs on one test set: BLEU, chrF, TER with 95%% "
        "intervals, paired significance against the first, wins and losses per line",
    )
    p.add_argument(
        "systems",
        nargs="+",
        metavar="SYSTEM",
        help="a hypothesis file, or a run directory with its test.hyp.* (the first: the baseline)",
    )
    p.add_argument("--ref", required=True, help="the reference text (.gz allowed)")
    p.add_argument(
        "--metrics",
        nargs="+",
        choices=["bleu", "chrf", "ter"],
        default=["bleu", "chrf", "ter"],
        help="sacrebleu's metrics to score and test (default: all three; TER is the slow one)",
    )
    p.add_argument(
        "--sentence-metric",
        choices=["chrf", "bleu"],
        default="chrf",
        help="the per-line score of wins and losses (default chrf: sentence BLEU is mostly 0s)",
    )
    p.add_argument(
        "--bootstrap",
        type=_at_least(2),
        default=1000,
        help="bootstrap resamples: intervals and the paired bootstrap test (sacrebleu's default)",
    )
    p.add_argument(
        "--trials",
        type=_at_least(1),
        default=10000,
        help="approximate-randomization trials (sacrebleu's default)",
    )
    p.add_argument("--chart", help="runs given: draw their validation curves into this PNG")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=_compare)
