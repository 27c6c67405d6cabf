"""The parts of a decode step that issue 39's fourth pass changed, each timed against what it
replaced, at a full step's shapes (the demo model: 64 sentences x beam 4, d256, 4 heads,
8,000 pieces), on the CPU; prints milliseconds per call (median of --reps) and the ratio.

    PYTHONPATH=src .venv/bin/python benchmarks/decode_parts.py [--threads 2] [--reps 50]

- the self-attention's scores product over 40 positions of 4 slots: K^T read from the cache's
  (n, h, capacity, W, d) view (what ``LayerCache`` keeps), against keys stored transposed (tried
  and reverted: faster in bf16, slower in fp32, docs/benchmarks.md);
- a step's log-softmax of fp32 logits into a second buffer, against in place (what the search
  does since 2026-12-03; in a step, where the rows come in cold, it saves more than here);
- the step's top-2k of (n, b*V): ``Tensor.topk`` against ``beam.top_k``, and ``beam.top_k``
  after the beams' scores are added in a pass of their own against adding them where it looks;
- bf16 linears of a step's row counts: ``F.linear`` against packed for oneDNN (``PackedLinear``),
  where the CPU computes bf16 natively.
Each pair's results are checked equal before it is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.decode.beam import top_k
from aiayn.decode.packed import PackedLinear, bf16_packable

N, BEAMS, HEADS, D_K, D_MODEL, VOCAB = 64, 4, 4, 64, 256, 8000
POSITIONS, CAPACITY = 40, 120


def ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of ``fn`` over ``reps`` calls, after 5 unmeasured ones."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def pair(name: str, old: Callable[[], Tensor], new: Callable[[], Tensor], reps: int) -> None:
    """Check that the two give the same values, then time them."""
    a, b = old(), new()
    assert torch.equal(a, b), f"{name}: the two differ"
    t_old, t_new = ms(old, reps), ms(new, reps)
    print(f"{name:58s} {t_old:7.3f} -> {t_new:7.3f} ms  {t_old / t_new:5.2f}x", flush=True)


def scores_product(dtype: torch.dtype, reps: int) -> None:
    rows = N * HEADS
    q = torch.randn(rows, BEAMS, D_K).to(dtype)
    bias = torch.zeros(rows, BEAMS, POSITIONS * BEAMS, dtype=dtype)
    slots = torch.randn(N, HEADS, CAPACITY, BEAMS, D_K).to(dtype)  # (n, h, capacity, W, d)
    stored = slots.permute(0, 1, 4, 2, 3).contiguous()  # (n, h, d, capacity, W)

    def gathered() -> Tensor:
        keys = slots[:, :, :POSITIONS].flatten(2, 3).flatten(0, 1).transpose(1, 2)
        return torch.baddbmm(bias, q, keys, alpha=D_K**-0.5)

    def transposed() -> Tensor:
        keys = stored[..., :POSITIONS, :].flatten(3, 4).flatten(0, 1)  # (n*h, d, P*W)
        return torch.baddbmm(bias, q, keys, alpha=D_K**-0.5)

    pair(f"scores product, {dtype}: K^T gathered -> stored transposed", gathered, transposed, reps)


def candidates(reps: int) -> None:
    scores = torch.randn(N, BEAMS, 1)
    lprobs = torch.randn(N, BEAMS, VOCAB)
    kept = torch.empty_like(lprobs)
    logits = 3 * torch.randn(N * BEAMS, VOCAB)
    second, work = torch.empty_like(logits), logits.clone()
    pair(  # in place: the first call normalises the logits, the rest the same bytes again
        "log-softmax of fp32 logits: into a second buffer -> in place",
        lambda: torch.log_softmax(logits, dim=-1, out=second),
        lambda: torch.log_softmax(work, dim=-1, out=work),
        reps,
    )
    summed = (lprobs + scores).view(N, BEAMS * VOCAB)
    pair(
        "top-2k of (n, b*V): topk -> beam.top_k",
        lambda: summed.topk(2 * BEAMS, dim=1).values,
        lambda: top_k(summed.view(N, BEAMS, VOCAB), 2 * BEAMS)[0],
        reps,
    )
    pair(
        "beam.top_k: the beams' scores added first -> added where it looks",
        lambda: top_k(torch.add(lprobs, scores, out=kept), 2 * BEAMS)[0],
        lambda: top_k(lprobs, 2 * BEAMS, scores.squeeze(-1))[0],
        reps,
    )


def bf16_linears(reps: int) -> None:
    if not bf16_packable():
        print("bf16 linears: skipped, the CPU or oneDNN has no native bf16")
        return
    for rows in (N * BEAMS, BEAMS):
        for d_in, d_out in ((D_MODEL, 3 * D_MODEL), (D_MODEL, 4 * D_MODEL), (D_MODEL, VOCAB)):
            linear = nn.Linear(d_in, d_out).to(torch.bfloat16)
            packed = PackedLinear(linear)
            x = torch.randn(rows, 1, d_in).to(torch.bfloat16)
            with torch.no_grad():
                pair(
                    f"bf16 linear {d_in}->{d_out}, {rows} rows: F.linear -> packed",
                    lambda: F.linear(x, linear.weight, linear.bias),
                    lambda: packed(x),
                    reps,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        scores_product(dtype, args.reps)
    candidates(args.reps)
    bf16_linears(args.reps)


if __name__ == "__main__":
    main()
