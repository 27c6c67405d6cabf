"""What checking a checkpoint's SHA-256 (``aiayn.checkpoint.digest``) costs beside reading its weights:
for the tiny preset and the base model (d_model 512, ~65M parameters) in fp32, the median
seconds of a plain read of ``model.safetensors``, of ``safetensors.torch.load_file``, and of
the digest, each from the page cache (the state a load right after a save or a copy sees), and
the digest as a share of ``load_file``. Also blake2b for comparison (not ``sha256sum``-checkable).

    PYTHONPATH=src .venv/bin/python benchmarks/digest_cost.py [--reps 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

import aiayn
from aiayn.checkpoint import save_weights
from aiayn.checkpoint.digest import file_sha256


def _median_s(work: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _blake2b(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print("| model | MB | read s | load_file s | sha256 s | blake2b s | sha256 / load_file |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("tiny", "base"):
            model = aiayn.Transformer(aiayn.ModelConfig.preset(preset, vocab_size=37000))
            path = Path(tmp) / f"{preset}.safetensors"
            save_weights(model, path)
            del model
            path.read_bytes()  # into the page cache
            read = _median_s(path.read_bytes, args.reps)
            load = _median_s(lambda: load_file(str(path)), args.reps)
            sha = _median_s(lambda: file_sha256(path), args.reps)
            blake = _median_s(lambda: _blake2b(path), args.reps)
            mb = path.stat().st_size / 1e6
            print(
                f"| {preset} | {mb:.1f} | {read:.4f} | {load:.4f} | {sha:.4f} | {blake:.4f} "
                f"| {sha / load:.2f} |"
            )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
