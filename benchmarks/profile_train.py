"""torch.profiler table of one aiayn training step (the step of train_throughput.py), CPU, fp32.

PYTHONPATH=src .venv/bin/python benchmarks/profile_train.py --config small [--variant lsloss]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from train_throughput import SHAPES, Runner, make_batches


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="small", choices=list(SHAPES))
    p.add_argument("--variant", default="", help="as the +suffix of train_throughput's 'ours+...'")
    p.add_argument("--adam", default="default", choices=["default", "foreach", "fused"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rows", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(2)
    sh = SHAPES[args.config]
    batches = make_batches(args.steps + 2, 32, 30, 20, sh.vocab, 1234)
    r = Runner("ours", sh, args.adam, args.variant)
    r.run(batches[:2])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        r.run(batches[2:])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
