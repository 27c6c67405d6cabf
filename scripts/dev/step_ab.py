"""Rows of train_throughput.py's training step against each other in CPU time, one step of each
in turn: for a change worth a few percent on a machine shared with other jobs, where wall-clock
rates swing by more than that. ``time.process_time`` counts only this process's CPU seconds, so
another job's bursts slow a row only through the caches and memory they share; the rows
alternate step by step (the first rotating) and the medians are compared.

    # the loss taking bf16 logits as they are, against casting them first (issue 40)
    PYTHONPATH=src .venv/bin/python scripts/dev/step_ab.py \\
        ours+lsloss+fusedadam+bf16+castloss ours+lsloss+fusedadam+bf16 --steps 30
    # bf16 against fp32, 1 thread
    PYTHONPATH=src .venv/bin/python scripts/dev/step_ab.py \\
        ours+lsloss+fusedadam ours+lsloss+fusedadam+bf16

Rows are train_throughput.py's ``--peers`` names (its variants: see its ``--help``); the first
is the baseline. With --threads above 1 CPU time sums the threads' seconds: a measure of work,
not of latency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

# the rows are benchmarks/train_throughput.py's, so that the A-B and the suite time one step
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from train_throughput import SHAPES, Runner, make_batches  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="+", help="train_throughput.py peer names; the first is the base")
    p.add_argument("--config", default="small", choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=20, help="timed steps of each row")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--record", help="write the rows' CPU time a step as a record here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sh = SHAPES[args.config]
    batches = make_batches(12, 32, 30, 20, sh.vocab, 1234)
    runners = []
    for name in args.rows:
        torch.manual_seed(0)
        runner = Runner(name, sh, "default", name.partition("+")[2])
        runner.run(batches[:2])  # warm-up (and compilation, for +compile)
        runners.append(runner)
    seconds: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(args.steps):
        batch = batches[2 + i % 10]
        for r in runners[i % len(runners) :] + runners[: i % len(runners)]:
            start = time.process_time()
            r.step(batch)
            seconds[r.name].append(time.process_time() - start)
    base = statistics.median(seconds[args.rows[0]])
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} steps a row")
    for name, ts in seconds.items():
        median = statistics.median(ts)
        print(
            f"{name:<45} median {median * 1e3:7.1f} ms, quartile {statistics.quantiles(ts)[0] * 1e3:7.1f}"
            f" ms CPU a step: {base / median:.3f}x the first row"
        )
    if args.record:
        record(seconds, args)


def record(seconds: dict[str, list[float]], args: argparse.Namespace) -> None:
    """Each row's speed against the first (> 1: faster), and its median CPU ms a step."""
    from aiayn.records import make_record, write_record

    base, first = statistics.median(seconds[args.rows[0]]), args.rows[0]
    figures: dict[str, float | int | str] = {}
    for name, ts in list(seconds.items())[1:]:
        figures[f"{name} / {first}"] = f"{base / statistics.median(ts):.3f}x"
    figures |= {f"{name} ms": round(1e3 * statistics.median(ts), 1) for name, ts in seconds.items()}
    entry = make_record(
        topic="training",
        what=f"training step rows against {first}, CPU time ({args.config} shape)",
        figures=figures,
        command="scripts/dev/step_ab.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        notes=f"median CPU time of {args.steps} steps a row, rows alternating step by step",
    )
    print(f"wrote {write_record(entry, args.record)}")


if __name__ == "__main__":
    main()
