"""Where a decode step's time goes: the first ``--lines`` test verses decoded as ``aiayn
evaluate`` does (``decode_ids``, default request), under ``torch.profiler``, by operator.

    PYTHONPATH=src .venv/bin/python scripts/dev/profile_decode.py \
        --checkpoint runs/demo/averaged --lines 300 --threads 1
    # another tree's code, the same measurement (e.g. before a change):
    PYTHONPATH=/path/to/other/src .venv/bin/python scripts/dev/profile_decode.py ...

Prints the wall time under the profiler, the operators by self CPU time, and the groups that
docs/benchmarks.md compares: the linears, attention (the fused kernel or the batched matrix
products and their softmax), moving the cache (``index_select``) and the search's
``log_softmax`` + ``topk``. The profiler adds its own overhead: compare groups, not walls.
Then the operators a step dispatches from Python (nested ones not counted), in the model's
``decode_step`` and in all, per step: a count that the machine's load does not move.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from aiayn.checkpoint import load_translator
from aiayn.decode import beam as beam_module
from aiayn.decode.translate import decode_ids
from aiayn.runtime.ready import for_decoding

TEST = Path(__file__).resolve().parents[2] / "src" / "aiayn" / "corpus" / "bible" / "test.en.gz"
OPS = ("aten::", "mkldnn::")  # what an operator's profiler event is named
STEP = "decode_step"
GROUPS = {
    "linears": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"),
    "attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_softmax",
    ),
    "cache moves (index_select)": ("aten::index_select",),
    "log_softmax + topk": ("aten::_log_softmax", "aten::topk"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, default=15, help="operators listed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = load_translator(args.checkpoint)
    model = for_decoding(model, None, args.precision)
    with gzip.open(TEST, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")[: args.lines]
    sources = [vocab.encode_source(line) for line in lines]
    decode_ids(model, sources[:64])  # warm-up
    steps = count_steps(model)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_ids(model, sources)
    wall = time.perf_counter() - start
    print(f"{len(sources)} verses, {args.precision}, {args.threads} thread(s): {wall:.2f} s")
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    total = sum(e.self_cpu_time_total for e in averages)
    for group, names in GROUPS.items():
        us = sum(e.self_cpu_time_total for e in averages if e.key in names)
        print(f"{group}: {us / 1e6:.2f} s ({us / total:.0%} of self CPU time)")
    top = [e for e in prof.events() if e.name.startswith(OPS) and not _under_op(e)]
    in_step = sum(1 for e in top if e.cpu_parent is not None and e.cpu_parent.name == STEP)
    print(
        f"ops per step: {in_step / steps[0]:.1f} in decode_step, {len(top) / steps[0]:.1f} in all"
    )


def count_steps(model) -> list[int]:
    """Wraps the search's ``decode_step`` (``aiayn.decode.cache``) to count its calls (list[0])
    and to mark them for the profiler, so that the ops it dispatches can be told from the
    search's."""
    steps, step = [0], beam_module.decode_step

    def marked(*args, **kwargs):
        steps[0] += 1
        with record_function(STEP):
            return step(*args, **kwargs)

    beam_module.decode_step = marked
    return steps


def _under_op(event) -> bool:
    return event.cpu_parent is not None and event.cpu_parent.name.startswith(OPS)


if __name__ == "__main__":
    main()
