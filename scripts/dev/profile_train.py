"""torch.profiler table of aiayn training steps (the step of train_throughput.py), CPU, and the
dtype casts per step (``aten::_to_copy`` of tensors; Python numbers made into 0-d tensors are
counted apart, as fused Adam's step counters, the same in fp32): their count beside the number of
parameter tensors says how often the weights and activations cross between fp32 and bf16.

PYTHONPATH=src .venv/bin/python scripts/dev/profile_train.py --config small [--variant lsloss]
PYTHONPATH=src .venv/bin/python scripts/dev/profile_train.py --variant lsloss+fusedadam+bf16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# the rows are benchmarks/train_throughput.py's, so that the A-B and the suite time one step
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from train_throughput import SHAPES, Runner, make_batches  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="small", choices=list(SHAPES))
    p.add_argument("--variant", default="", help="as the +suffix of train_throughput's 'ours+...'")
    p.add_argument("--adam", default="default", choices=["default", "foreach", "fused"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rows", type=int, default=30)
    p.add_argument("--record", help="write the matmul share and the casts as a record here")
    args = p.parse_args()
    torch.set_num_threads(2)
    sh = SHAPES[args.config]
    batches = make_batches(args.steps + 2, 32, 30, 20, sh.vocab, 1234)
    r = Runner("ours", sh, args.adam, args.variant)
    r.run(batches[:2])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        r.run(batches[2:])
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    total = sum(e.self_cpu_time_total for e in averages)
    casts = [e for e in prof.events() if e.name == "aten::_to_copy"]
    tensors = [e for e in casts if e.input_shapes and e.input_shapes[0]]  # not 0-d
    share = sum(e.cpu_time_total for e in tensors) / max(total, 1)
    params = len(list(r.model.parameters()))
    print(
        f"aten::_to_copy (dtype casts) per step: {len(tensors) / args.steps:.0f} of tensors "
        f"({len(tensors) / args.steps / params:.2f} per parameter tensor; {share:.1%} of the "
        f"self CPU time, inclusive) and {(len(casts) - len(tensors)) / args.steps:.0f} of Python "
        f"numbers; the model has {params} parameter tensors"
    )
    if args.record:
        matmuls = sum(
            e.self_cpu_time_total for e in averages if e.key in ("aten::mm", "aten::addmm")
        )
        record(args, matmuls / max(total, 1), len(tensors) / args.steps, params)


def emulated(args: argparse.Namespace) -> str:
    """What a bf16 row's time shares are worth on a CPU that emulates bf16."""
    from aiayn.runtime.hardware import bf16_support

    if "bf16" not in args.variant.split("+") or bf16_support(torch.device("cpu")).native:
        return ""
    return "; bf16 emulated on this CPU: its time shares are not a bf16 CPU's, the casts are"


def record(args: argparse.Namespace, matmul_share: float, casts: float, params: int) -> None:
    """The step's matmul share of CPU time and its casts a step, as a record (topic training);
    with emulated bf16 (no avx512_bf16 or AMX) only the casts mean anything."""
    from aiayn.records import make_record, write_record

    entry = make_record(
        topic="training",
        what=f"one training step's profile, ours+{args.variant} ({args.config} shape)",
        figures={
            "matmuls (mm + addmm) of the CPU time": f"{matmul_share:.0%}",
            "casts a step": round(casts),
            "casts per parameter tensor": f"{casts / params:.2f}",
        },
        command="scripts/dev/profile_train.py " + " ".join(sys.argv[1:]),
        threads=2,
        notes=f"torch.profiler over {args.steps} steps after 2 warm-up steps" + emulated(args),
    )
    print(f"wrote {write_record(entry, args.record)}")


if __name__ == "__main__":
    main()
