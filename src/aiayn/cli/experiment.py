"""``aiayn experiment NAME``: the paper's experiments and its open questions, resumable, with
tables and plots (``aiayn.experiments``, docs/experiments.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError
from .stopping import one_line_on_signal


def _experiment(args: argparse.Namespace) -> None:
    from ..experiments import TRAINING, run_experiment
    from ..experiments.runner import read_budget
    from ..files import check_not_input

    budget = read_budget(args.budget or [])
    _check_seeds(args.seeds, args.name, TRAINING)
    out = Path(args.out or f"runs/exp/{args.name}")
    if args.report_only and not (out / "results.json").exists():  # before preparing any corpus
        raise UserError(
            f"{out / 'results.json'} does not exist: no row of {args.name} has been measured there"
        )
    data = args.data if args.name in TRAINING else None
    check_not_input(out, [data, args.checkpoint, *(args.valid or ())], option="--out")
    inputs: dict = {}
    if args.name in TRAINING:
        from ..experiments.inputs import Corpus, load_corpus, valid_paths

        # --report-only runs nothing, so it prepares no corpus: the record check names a wrong --data
        inputs["corpus"] = (
            Corpus(Path(args.data), valid_paths(args.valid))
            if args.report_only
            else load_corpus(Path(args.data), args.valid)
        )
    elif args.name == "heads":
        from ..experiments.inputs import valid_paths

        if not args.checkpoint:
            raise UserError("experiment heads needs --checkpoint (e.g. runs/demo/averaged)")
        inputs = {"checkpoint": Path(args.checkpoint), "valid": valid_paths(args.valid)}
    command = " ".join(
        [
            "aiayn experiment",
            args.name,
            *(f"--budget {b}" for b in args.budget or []),
            *([f"--data {args.data}"] if args.name in TRAINING else []),
            *([f"--valid {args.valid[0]} {args.valid[1]}"] if args.valid else []),
            *([f"--checkpoint {args.checkpoint}"] if args.checkpoint else []),
            *([f"--seeds {args.seeds}"] if args.seeds > 1 else []),
            f"--out {out}",
        ]
    )
    again = f"re-running the same command resumes: {out / 'results.json'} keeps finished rows"
    with one_line_on_signal("experiment", again):
        results = run_experiment(
            args.name,
            out,
            budget,
            command=command,
            report_only=args.report_only,
            seeds=args.seeds,
            **inputs,
        )
    print(
        f"{len(results['rows'])} rows -> {out / 'results.md'}, {out / 'results.json'}, "
        + ", ".join(results["plots"])
    )


def _check_seeds(seeds: int, name: str, training: tuple[str, ...]) -> None:
    """Refuse ``--seeds`` before any corpus is prepared: below 1, or for rows that train nothing."""
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    if seeds > 1 and name not in training:
        raise UserError(
            f"--seeds repeats training rows; experiment {name} trains nothing "
            f"(training experiments: {', '.join(training)})"
        )


def add_experiment(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="the paper's experiments and its open questions, resumable, "
        "with tables and plots (docs/experiments.md)",
    )
    from ..experiments import MODULES  # torch-free: the names only

    p.add_argument("name", choices=list(MODULES))
    p.add_argument(
        "--budget",
        action="append",
        metavar="KEY=VALUE",
        help="preset, updates, sentences, max_tokens, seconds, threads (experiments.runner.Budget)",
    )
    p.add_argument(
        "--out", help="results directory (default runs/exp/NAME); a rerun skips finished rows"
    )
    p.add_argument(
        "--data",
        default="work/bible",
        help="prepared dataset (the bundled corpus is prepared there when missing)",
    )
    p.add_argument(
        "--valid",
        nargs=2,
        metavar=("SRC", "REF"),
        help="raw validation text for BLEU (default: the bundled corpus's)",
    )
    p.add_argument("--checkpoint", help="heads: the model to inspect")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="train each row N times (the recipe's seed, then + 1 ...): mean, standard "
        "deviation and a paired test against the base row; a rerun adds to the seeds measured",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write results.md and the plots from the rows finished so far (by any process); "
        "run none",
    )
    p.set_defaults(func=_experiment)
