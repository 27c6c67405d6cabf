"""The benchmark suite in one command: every script of benchmarks/, each writing its figures as
records (``aiayn.records``) that render the docs' tables (``python -m aiayn.records render``).

    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py                        # records/
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --only train,decode
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --fairseq-python ../peersvenv/bin/python
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --only marian --marian ../marianvenv/bin/pymarian
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --check --record /tmp/records  # seconds

Each benchmark runs in a process of its own, one after another; run the suite with nothing else
on the machine (a second job changes every ratio), from the repository root. What a benchmark
needs and this machine lacks is skipped with the reason: the demo model (``--checkpoint``,
default runs/demo/averaged, from ``make demo``) for the test split, the engine and serving;
native bf16 for bf16 training; fairseq's interpreter (``--fairseq-python``) and Marian's
trainer (``--marian``) for the demo comparisons. Peers that are not installed (``pip install -e
.[bench]``) are skipped by each script. ``--check`` runs every command on tiny shapes in about
a minute: a check that the suite works, not figures to keep (write its records elsewhere).

Cost of the whole suite on 2 CPU cores: about 1 h 30 min, 15 of it the fairseq comparison's
training budget for each system; the Marian comparison adds about 35 minutes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPICS = (
    "train",
    "train-bf16",
    "decode",
    "decode-testset",
    "engine",
    "serve",
    "prepare",
    "fairseq",
    "marian",
)
BF16_PEERS = "ours+lsloss+fusedadam,torch.nn+fusedadam,hf-marian+fusedadam"


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each topic's command line (script and options, without --record), full or ``--check``."""
    ckpt, check = ["--checkpoint", args.checkpoint], args.check
    tiny_train = ["--configs", "tiny", "--reps", "1", "--steps", "1", "--warmup", "1"]
    tiny_train += ["--batches", "2", "--threads", "1"]
    one = ["--limit", "4", "--repeats", "1", "--threads", "1"] if check else []
    return {
        "train": ["train_throughput.py", *(tiny_train if check else [])],
        "train-bf16": ["train_throughput.py", "--bf16", "--peers", BF16_PEERS]
        + (tiny_train if check else ["--configs", "small"]),
        "decode": ["decode_throughput.py"]
        + (["--configs", "tiny", "--n1", "1", "--n32", "2", "--repeats", "1"] if check else []),
        "decode-testset": ["decode_throughput.py", "--testset", args.checkpoint, *one],
        "engine": ["decode_throughput.py", "--engine", args.checkpoint, *one],
        "serve": ["serve_load.py", *ckpt, "--runs", "on", "off"]
        + (["--clients", "2", "--requests", "2", "--sentences", "4"] if check else []),
        "prepare": ["prepare_scale.py"]
        + (["--sizes", "2k", "--workers", "1", "--vocab-size", "300"] if check else []),
        "fairseq": ["demo_vs_fairseq.py", "--fairseq-python", str(args.fairseq_python)]
        + ["--out", str(Path(args.record) / "demo_vs_fairseq")]
        + (["--minutes", "0.5", "--threads", "1", "--test-limit", "20"] if check else []),
        "marian": ["demo_vs_marian.py", "--marian", str(args.marian)]
        + ["--out", str(Path(args.record) / "demo_vs_marian")]
        + (["--updates", "5", "--threads", "1"] if check else ["--minutes", "15"]),
    }


def missing(topic: str, args: argparse.Namespace) -> str | None:
    """Why this machine cannot run ``topic`` now, or None."""
    if topic in ("decode-testset", "engine", "serve") and not Path(args.checkpoint).is_dir():
        return f"no demo model at {args.checkpoint} (make demo, or --checkpoint)"
    if topic == "fairseq" and not args.fairseq_python:
        return "no --fairseq-python (demo_vs_fairseq.py's docstring makes one)"
    if topic == "marian" and not args.marian:
        return "no --marian (demo_vs_marian.py's docstring makes one)"
    if topic == "train-bf16":
        import torch

        from aiayn.runtime import hardware

        support = hardware.bf16_support(torch.device("cpu"))
        return None if support.native else support.reason
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma list of: " + ", ".join(TOPICS))
    p.add_argument("--record", default="records", help="where the records go (default: records/)")
    p.add_argument("--checkpoint", default="runs/demo/averaged", help="the demo model")
    p.add_argument("--fairseq-python", help="an interpreter with fairseq, for the comparison")
    p.add_argument("--marian", help="Marian's pymarian command, for the Marian comparison")
    p.add_argument("--check", action="store_true", help="tiny shapes: a check of the commands")
    args = p.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(TOPICS)
    unknown = set(chosen) - set(TOPICS)
    if unknown:
        p.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(TOPICS)}")
    Path(args.record).mkdir(parents=True, exist_ok=True)
    failed = []
    for topic, (script, *options) in commands(args).items():
        if topic not in chosen:
            continue
        reason = missing(topic, args)
        if reason:
            print(f"== {topic}: skipped: {reason}", flush=True)
            continue
        command = [sys.executable, str(HERE / script), *options, "--record", args.record]
        print(f"== {topic}: {' '.join(command[1:])}", flush=True)
        if subprocess.run(command).returncode:
            failed.append(topic)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
