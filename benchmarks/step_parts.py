"""Where a decode step's wall time goes at batch 1 or 32: the decoder's layers, the output
projection, and the search with the rest, by ``perf_counter`` around ``decode_state`` and
``generator`` (the profiler inflates a 4-row step's small operators several times).

    PYTHONPATH=src .venv/bin/python benchmarks/step_parts.py --batch 1
    PYTHONPATH=src .venv/bin/python benchmarks/step_parts.py --batch 32

The model and sources are ``decode_throughput.py``'s (d256 3+3, random weights, beam 4, 40
forced tokens, packed fp32); prints ms per step for each of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from decode_throughput import BEAM, CONFIGS, OUT_LEN, batches, our_model, sources  # noqa: E402

from aiayn.decode import DecodeConfig, beam_search  # noqa: E402
from aiayn.decode import beam as beam_module  # noqa: E402
from aiayn.decode import cache as cache_module  # noqa: E402
from aiayn.decode.packed import pack_linears  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="sentences decoded together")
    parser.add_argument("--sentences", type=int, help="default: 20 at batch 1, else 64")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = pack_linears(our_model(CONFIGS["d256"]))
    n = args.sentences or (20 if args.batch == 1 else 64)
    chunks = [src for _, src in batches(sources(n, 8000), args.batch)]
    config = DecodeConfig(beam=BEAM, alpha=0.6, max_len_a=0, max_len_b=OUT_LEN)
    spent = {"layers": 0.0, "projection": 0.0, "steps": 0}
    generator = model.generator

    def timed_step(tgt_in: torch.Tensor, cache) -> torch.Tensor:
        start = time.perf_counter()
        state = cache_module.decode_state(model, tgt_in, cache)
        middle = time.perf_counter()
        logits = generator(state)
        spent["layers"] += middle - start
        spent["projection"] += time.perf_counter() - middle
        spent["steps"] += 1
        return logits

    beam_module.decode_step = lambda _, tgt_in, cache: timed_step(
        tgt_in, cache
    )  # the search's step
    for run in range(args.repeats + 1):  # the first run warms up
        spent.update(layers=0.0, projection=0.0, steps=0)
        start = time.perf_counter()
        with torch.inference_mode():
            for src in chunks:
                beam_search(model, src, config, min_len=OUT_LEN)
        total, steps = time.perf_counter() - start, spent["steps"]
        if run:
            rest = total - spent["layers"] - spent["projection"]
            print(
                f"batch {args.batch}: step {total / steps * 1e3:.3f} ms = layers "
                f"{spent['layers'] / steps * 1e3:.3f} + output projection "
                f"{spent['projection'] / steps * 1e3:.3f} + search and rest "
                f"{rest / steps * 1e3:.3f}; {OUT_LEN * n / total:.1f} target tokens/s"
            )


if __name__ == "__main__":
    main()
