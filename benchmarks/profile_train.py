"""torch.profiler table of aiayn training steps (the step of train_throughput.py), CPU, and the
casts autocast makes per step: their count beside the number of parameter tensors says whether
each weight is cast once per forward (autocast's weight cache) or once per use.

PYTHONPATH=src .venv/bin/python benchmarks/profile_train.py --config small [--variant lsloss]
PYTHONPATH=src .venv/bin/python benchmarks/profile_train.py --variant lsloss+fusedadam+bf16
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
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    total = sum(e.self_cpu_time_total for e in averages)
    casts = [e for e in averages if e.key == "aten::_to_copy"]
    n_casts = sum(e.count for e in casts) / args.steps
    share = sum(e.cpu_time_total for e in casts) / max(total, 1)
    params = len(list(r.model.parameters()))
    print(
        f"aten::_to_copy (dtype casts) per step: {n_casts:.0f} calls, {share:.1%} of the self CPU "
        f"time (inclusive); the model has {params} parameter tensors"
    )


if __name__ == "__main__":
    main()
