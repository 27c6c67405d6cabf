"""`aiayn prepare` at WMT scale: wall time and peak memory for growing synthetic corpora.

    python benchmarks/prepare_scale.py [--sizes 0.1M,1M,5M] [--vocab-size 8000] [--dir /tmp]

Each corpus is the bundled training split (27,959 pairs) repeated, every copy shuffled
(seed 0), and cut to the size; it is written to a temporary directory under ``--dir`` and
removed after its run. ``python -m aiayn prepare`` runs in a child process and its peak
resident memory is the ``ru_maxrss`` that ``os.wait4`` reports for that child alone. The goal
(issue 12): time linear in the number of pairs, peak memory flat (under 1.5 GB at 5M pairs).
Run it with another ``PYTHONPATH`` to measure another version of the code.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiayn.data import bundled_corpus_paths, read_parallel


def parse_size(text: str) -> int:
    """ "0.1M" -> 100000, "100k" -> 100000, "2500" -> 2500."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def write_corpus(pairs: list[tuple[str, str]], n: int, src: Path, tgt: Path, seed: int = 0) -> int:
    """Write the first ``n`` pairs of shuffled copies of ``pairs``; returns the bytes written."""
    rng, order, left = random.Random(seed), list(range(len(pairs))), n
    with open(src, "w", encoding="utf-8") as fs, open(tgt, "w", encoding="utf-8") as ft:
        while left > 0:
            rng.shuffle(order)
            chosen = order[:left]
            fs.write("".join(pairs[i][0] + "\n" for i in chosen))
            ft.write("".join(pairs[i][1] + "\n" for i in chosen))
            left -= len(chosen)
    return src.stat().st_size + tgt.stat().st_size


def run_prepare(src: Path, tgt: Path, out: Path, vocab_size: int, max_len: int) -> dict[str, float]:
    """Wall seconds, peak RSS (MB) and prepare's own timings, from a child process."""
    cmd = [
        sys.executable,
        "-m",
        "aiayn",
        "prepare",
        "--train-src",
        str(src),
        "--train-tgt",
        str(tgt),
        "--out",
        str(out),
        "--vocab-size",
        str(vocab_size),
        "--max-len",
        str(max_len),
    ]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout:
        child = subprocess.Popen(cmd, stdout=stdout)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
        if child.returncode != 0:
            raise SystemExit(f"prepare failed ({child.returncode}): {' '.join(cmd)}")
        stdout.seek(0)
        summary = json.loads(stdout.read())
    return {
        "wall": wall,
        "rss_mb": usage.ru_maxrss / 1024,  # Linux reports KiB
        "vocab": summary["seconds"]["vocab"],
        "total": summary["seconds"]["total"],
        "kept": summary["splits"]["train"]["pairs"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="0.1M,1M,5M", help="comma-separated pair counts (k, M suffixes)"
    )
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument(
        "--dir", default=None, help="where the temporary corpora go (default: $TMPDIR)"
    )
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    base, _ = read_parallel(*bundled_corpus_paths()["train"])
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        f"vocab {args.vocab_size}, max_len {args.max_len}",
        flush=True,
    )
    print(
        "| pairs | text MB | prepare s (wall) | vocabulary s | binarise s | s per 1M pairs | peak RSS MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for n in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            src, tgt = Path(tmp) / "train.en", Path(tmp) / "train.es"
            size = write_corpus(base, n, src, tgt)
            r = run_prepare(src, tgt, Path(tmp) / "data", args.vocab_size, args.max_len)
        print(
            f"| {n:,} | {size / 1e6:,.0f} | {r['wall']:,.1f} | {r['vocab']:,.1f} | "
            f"{r['total'] - r['vocab']:,.1f} | {r['wall'] / n * 1e6:,.1f} | {r['rss_mb']:,.0f} |",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end (other jobs share the machine)")


if __name__ == "__main__":
    main()
