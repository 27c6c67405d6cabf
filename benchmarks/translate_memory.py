"""Peak memory of ``aiayn translate --input`` on a 100k-line and a 1M-line file: flat in the
file's size, since a file is read, sorted and written a window of ``--window`` lines at a time.

Each input repeats short lines of the bundled corpus (``aiayn/corpus/bible/train.en.gz``,
verses that encode to at most ``MAX_SOURCE`` subwords) to ``--lines`` lines. The model is a
random-weight 1+1-layer d32 Transformer with 16 positions (so every output stops at 16 tokens),
saved with a 500-piece vocabulary trained on the same text; it decodes with ``--beam 1
--batch-size 256``. Each size runs ``python -m aiayn translate --input FILE --quiet`` in a
subprocess of its own, whose peak resident set size is read with ``os.wait4`` (the rusage of
that child alone: ``getrusage(RUSAGE_CHILDREN)`` keeps the maximum over every child so far).
A file shorter than the window is one window, so compare sizes of at least one window each
(or pass ``--window``).

Cost: about 6 minutes per million lines on one CPU core (``--threads 1``), plus half a minute
of set-up; the 1M-line file is about 40 MB. Only the timings need a quiet machine. Expected:
a peak ratio near 1 between sizes of a window or more each; a file shorter than the window
peaks lower, its one window being smaller.

    python benchmarks/translate_memory.py                          # 100k and 1M lines
    python benchmarks/translate_memory.py --lines 20000 200000     # a quick check

Prints, per size: lines, peak RSS (MiB), wall seconds and sentences/s; then the ratio of the
largest peak to the smallest (1.0: flat) and of the sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from itertools import cycle, islice
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from aiayn import ModelConfig, Transformer  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.data import Vocab, bundled_corpus_paths  # noqa: E402
from aiayn.files import count_lines, iter_lines  # noqa: E402

MAX_SOURCE = 12  # subwords (eos included) of a line kept: far below the model's positions
POSITIONS = 16
BATCH_SIZE = 256  # sentences: a tiny model's step costs little, so larger batches go faster
VOCAB_SIZE = 500


def short_lines(vocab: Vocab, limit: int = 5000) -> list[str]:
    """Up to ``limit`` verses of the training split that encode to few subwords."""
    source = bundled_corpus_paths()["train"][0]
    kept = (line for line in iter_lines(source) if len(vocab.encode_source(line)) <= MAX_SOURCE)
    return list(islice(kept, limit))


def tiny_checkpoint(root: Path) -> Path:
    """A random-weight checkpoint (seed 0) with a vocabulary trained on the bundled English."""
    vocab = Vocab.train([bundled_corpus_paths()["train"][0]], root / "spm", VOCAB_SIZE)
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "tiny", N_enc=1, N_dec=1, d_model=32, d_ff=64, h=2, P_drop=0.0,
        vocab_size=len(vocab), max_len=POSITIONS,
    )  # fmt: skip
    meta = {"update": 0, "model_config": dataclasses.asdict(cfg)}
    return save_checkpoint(root / "checkpoints", 0, Transformer(cfg), meta, None, vocab.path)


def write_input(path: Path, lines: list[str], n: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in islice(cycle(lines), n))
    return path


def run_translate(ckpt: Path, src: Path, out: Path, extra: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one ``aiayn translate`` process."""
    argv = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(ckpt)]
    argv += ["--input", str(src), "--beam", "1", "--batch-size", str(BATCH_SIZE), "--quiet"]
    argv += extra
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    start = time.perf_counter()
    with open(out, "wb") as sink:
        child = subprocess.Popen(argv, stdout=sink, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"aiayn translate exited with {child.returncode} on {src}")
    return usage.ru_maxrss / 1024, wall  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--threads", default="2", help="OMP_NUM_THREADS of each run")
    parser.add_argument("--window", type=int, help="translate's --window (default: its own)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = args.threads
    extra = [] if args.window is None else ["--window", str(args.window)]
    with tempfile.TemporaryDirectory(prefix="translate-memory-") as tmp:
        root = Path(tmp)
        ckpt = tiny_checkpoint(root)
        lines = short_lines(Vocab.load(ckpt / "spm.model"))
        peaks = {}
        for n in sorted(args.lines):
            src = write_input(root / f"in.{n}.txt", lines, n)
            peak, wall = run_translate(ckpt, src, root / "out.txt", extra)
            assert count_lines(root / "out.txt") == n, "one output line per input line"
            peaks[n] = peak
            print(f"{n:>9,} lines: peak RSS {peak:7.1f} MiB, {wall:7.1f} s, {n / wall:8.0f} sent/s")
            src.unlink()
    small, large = min(peaks), max(peaks)
    print(
        f"peak RSS ratio {large:,} / {small:,} lines: {peaks[large] / peaks[small]:.3f} "
        f"(the file is {large / small:g} times as long)"
    )


if __name__ == "__main__":
    main()
