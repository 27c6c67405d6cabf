"""Attention of a bf16 training step on a CPU, five ways, forward and backward timed apart:
which precision and kernel model.fused_attention should use (docs/training.md, "bf16 on a CPU").

The q, k, v come from one bf16 projection (B, T, 3 h d_k), as the model's self-attention has
them; the output goes back to bf16 for W_O. Ways: SDPA's flash kernel on an fp32 cast of the
projection (the model's path, ``attention_precision``), SDPA's math backend in fp32 and in bf16,
the flash kernel in bf16, and "bf16 matmuls": Q K^T and P V as bf16 matmuls (the scores rounded
to bf16), softmax in fp32. Each row: median CPU milliseconds of the forward, and of forward plus
backward, 1 thread, rows in turn; and the largest error of output and gradient against the
same computed in fp64.

    PYTHONPATH=src .venv/bin/python benchmarks/attention_precision.py [--reps 40]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, T, D = 32, 4, 30, 64  # the small shape's batch of 32 sentences of <= 30 tokens


def _sdpa(backend: SDPBackend, dtype: torch.dtype) -> Callable[..., Tensor]:
    def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    return attend


def _bf16_matmuls(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    scores = (q @ k.transpose(-2, -1)).float() * D**-0.5  # (B, H, T, T), rounded to bf16 first
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


WAYS = {
    "fp32 flash (the model's)": _sdpa(SDPBackend.FLASH_ATTENTION, torch.float32),
    "fp32 math": _sdpa(SDPBackend.MATH, torch.float32),
    "bf16 flash": _sdpa(SDPBackend.FLASH_ATTENTION, torch.bfloat16),
    "bf16 math": _sdpa(SDPBackend.MATH, torch.bfloat16),
    "bf16 matmuls, fp32 softmax": _bf16_matmuls,
}


def run(way: str, proj: Tensor, mask: Tensor | None, causal: bool, backward: bool):
    """(output (B, T, H*D) bf16, the projection's gradient or None)."""
    x = proj.detach().requires_grad_()
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.split(H * D, dim=-1))  # (B,H,T,D)
    attend = WAYS[way] if x.dtype == torch.bfloat16 else _sdpa(SDPBackend.MATH, x.dtype)
    out = attend(q, k, v, mask, causal).transpose(1, 2).reshape(B, T, H * D).to(x.dtype)
    if backward:
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype))
    return out.detach(), x.grad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(B, T, 3 * H * D, generator=g).bfloat16()
    lengths = torch.randint(20, T + 1, (B,), generator=g)
    keys = (torch.arange(T) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T) key padding
    print(f"torch {torch.__version__}, 1 thread, (B, h, T, d_k) = {(B, H, T, D)}, {args.reps} reps")
    for causal, mask in ((False, keys), (True, None)):
        exact_out, exact_grad = run("", proj.double(), mask, causal, True)
        times: dict[str, list[list[float]]] = {w: [[], []] for w in WAYS}
        for _ in range(args.reps):
            for way in WAYS:
                for backward in (False, True):
                    start = time.process_time()
                    run(way, proj, mask, causal, backward)
                    times[way][backward].append(time.process_time() - start)
        print("decoder self-attention (causal)" if causal else "encoder self-attention (padding)")
        for way, (fwd, both) in times.items():
            out, grad = run(way, proj, mask, causal, True)
            assert grad is not None and exact_grad is not None
            f, fb = statistics.median(fwd) * 1e3, statistics.median(both) * 1e3
            print(
                f"  {way:<28} forward {f:5.2f} ms, backward {fb - f:5.2f} ms; largest error: "
                f"output {(out.double() - exact_out).abs().max():.1e}, "
                f"gradient {(grad.double() - exact_grad).abs().max():.1e}"
            )


if __name__ == "__main__":
    main()
