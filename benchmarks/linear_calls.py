"""What a decode step's matmuls cost on this CPU, call by call: why our fp32 step at batch 1 is
slower than CTranslate2's, and why a second thread gains it little.

    python benchmarks/linear_calls.py            # ~1 minute on 2 cores

Three measurements, each at 1 and 2 intra-op threads, each printed as a table:

1. one Linear call at the decoder's shapes (d256 3+3: 256 -> 768, 256, 1024, 1024 -> 256, and
   the 256 -> 8,000 output projection) on 4 rows (batch 1, beam 4), its weight hot in cache:
   oneDNN with the weight packed once (``aiayn.decode.packed``, what ``translate`` decodes
   with) against MKL's ``F.linear``; a 16 -> 16 call shows the fixed cost of a call;
2. a whole step's 19 Linear calls in order, each weight read once per step as when decoding
   (the 17 MB of weights stream from L3 or memory), packed and ``F.linear``;
3. the memory bandwidth a ``sum`` over 64 MB reaches, to compare with 2.

Prints microseconds per call, milliseconds per step and GB/s, with the CPU (``lscpu``'s model
and the bf16/VNNI flags).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from aiayn.decode.packed import available  # noqa: E402
from aiayn.hardware import cpu_description  # noqa: E402

ROWS = 4  # batch 1 x beam 4
# (in, out) of the d256 3+3 decoder's Linear layers in the order a step calls them
LAYER = [(256, 768), (256, 256), (256, 256), (256, 256), (256, 1024), (1024, 256)]
STEP = LAYER * 3 + [(256, 8000)]


def per_call_us(fn, n: int) -> float:
    for _ in range(max(10, n // 20)):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def linears(shapes: list[tuple[int, int]]) -> tuple[list, list]:
    """(packed calls, F.linear calls), one per shape, on random weights and 4-row inputs."""
    torch.manual_seed(0)
    packed, plain = [], []
    for k, n in shapes:
        x, w, b = torch.randn(ROWS, k), torch.randn(n, k), torch.randn(n)
        p = torch.ops.mkldnn._reorder_linear_weight(w)
        packed.append(
            lambda x=x, p=p, b=b: torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], "")
        )
        plain.append(lambda x=x, w=w, b=b: F.linear(x, w, b))
    return packed, plain


def main() -> None:
    if not available():
        raise SystemExit("this PyTorch has no oneDNN linear ops: nothing to compare")
    print(f"CPU: {cpu_description()}; PyTorch {torch.__version__}; {ROWS} rows")
    shapes = [(16, 16), (256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000)]
    print("\n1. one call, weight hot (us)")
    print("| in -> out | threads | oneDNN packed | MKL F.linear |")
    print("|---|---:|---:|---:|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        packed, plain = linears(shapes)
        for (k, n), a, b in zip(shapes, packed, plain):
            print(
                f"| {k} -> {n} | {threads} | {per_call_us(a, 2000):.1f} | {per_call_us(b, 2000):.1f} |"
            )
    print("\n2. a step's 19 Linear calls, each weight once a step (ms per step)")
    print("| threads | oneDNN packed | MKL F.linear |")
    print("|---:|---:|---:|")
    packed, plain = linears(STEP)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        step = [lambda calls=calls: [c() for c in calls] for calls in (packed, plain)]
        a, b = (per_call_us(s, 200) / 1e3 for s in step)
        print(f"| {threads} | {a:.2f} | {b:.2f} |")
    weights_mb = sum(k * n + n for k, n in STEP) * 4 / 1e6
    print(f"(the step's weights: {weights_mb:.1f} MB)")
    print("\n3. memory bandwidth, sum over 64 MB (GB/s)")
    x = torch.randn(16 * 2**20)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        print(f"{threads} thread(s): {x.numel() * 4 / per_call_us(x.sum, 30) / 1e3:.1f} GB/s")


if __name__ == "__main__":
    main()
