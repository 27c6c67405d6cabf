"""Counting the work: model FLOPs per batch, the device's measured matmul peak, and the
paper's training-cost estimate (Table 2 note: time x GPUs x sustained TFLOPS)."""

from __future__ import annotations

import time

import torch

from .config import ModelConfig


def forward_flops(cfg: ModelConfig, B: int, S: int, T: int, n_predicted: int | None = None) -> float:
    """Multiply-add FLOPs (2 per MAC) of one forward pass on a padded (B, S) -> (B, T) batch.

    Counts every matmul the model runs: projections and feed-forward layers per position,
    attention scores and weighted sums per query-key pair, and the vocabulary projection on
    ``n_predicted`` positions (default B * T). Norms, softmax and adds are ignored (<1%).
    """
    d, qk, v = cfg.d_model, cfg.h * cfg.dk, cfg.h * cfg.dv
    attn_proj = d * (2 * qk + v) + v * d  # W_Q, W_K, W_V, W_O per position
    ffn = 2 * d * cfg.d_ff
    enc = cfg.N_enc * (B * S * (attn_proj + ffn) + B * S * S * (qk + v))
    cross_proj = B * T * (d * qk + v * d) + B * S * d * (qk + v)  # queries/outputs; memory k, v
    dec = cfg.N_dec * (
        B * T * (attn_proj + ffn) + B * T * T * (qk + v)  # masked self-attention (full square)
        + cross_proj + B * T * S * (qk + v)
    )
    n_predicted = B * T if n_predicted is None else n_predicted
    return 2.0 * (enc + dec + n_predicted * d * cfg.vocab_size)


def training_flops(cfg: ModelConfig, B: int, S: int, T: int, n_predicted: int | None = None) -> float:
    """Forward + backward = 3 x forward (the backward pass costs two matmuls per forward one)."""
    return 3.0 * forward_flops(cfg, B, S, T, n_predicted)


def measure_matmul_peak(device: torch.device | str = "cpu", seconds: float = 1.0, trials: int = 5) -> float:
    """Sustained FLOP/s of large square matmuls on ``device`` in the training dtype (fp32 on
    CPU, bf16 on CUDA): the denominator of model FLOPs utilisation (MFU).

    The best of ``trials`` windows of ``seconds / trials`` each: a single window on a shared
    2-core machine measured anywhere from 86 to 249 GFLOP/s (an MFU of 162% against the low
    one); a peak is what the hardware can do, so a moment of contention must not lower it.
    """
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up
    _sync(device)
    best = 0.0
    for _ in range(trials):
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / trials:
            torch.matmul(a, b)
            reps += 1
            _sync(device)
        best = max(best, 2.0 * n**3 * reps / (time.perf_counter() - start))
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def paper_cost(seconds: float, devices: int, peak_flops: float) -> float:
    """Table 2's estimate: training time x number of devices x sustained throughput."""
    return seconds * devices * peak_flops
