"""One yardstick for the work, used by the trainer's summary and by
``benchmarks/train_throughput.py`` alike, so that their MFU figures compare:

- ``training_flops``: model FLOPs of a training step on a batch, counted on real tokens;
- ``measure_matmul_peak``: the device's sustained matmul FLOP/s, measured the same way everywhere;
- ``mfu``: model FLOPs utilisation, counted FLOPs over what the devices could have done;
- ``count_parameters``: the model's size, counted from its config as the FLOPs are.

Padding is not counted: a padded position is work the hardware does but the model does not
need, so it lowers MFU instead of raising the count (the "model FLOPs" of PaLM's MFU). Masked
self-attention is counted as the full square, as nanoGPT and PaLM count it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..config import ModelConfig
from ..errors import UserError


def forward_flops(cfg: ModelConfig, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> float:
    """Multiply-add FLOPs (2 per MAC) of one forward pass over sentence pairs whose source has
    ``src_lens[i]`` positions and whose decoder ``tgt_lens[i]`` (non-pad; eos and bos included
    as the model reads them: one decoder position per predicted token).

    Counts every matmul the model runs: projections and feed-forward layers per position,
    attention scores and weighted sums per query-key pair, the cross-attention keys and values
    of the memory in every decoder layer, and the vocabulary projection per target position.
    Norms, softmax and adds are ignored (<1%).
    """
    if len(src_lens) != len(tgt_lens):
        raise UserError(f"{len(src_lens)} source lengths but {len(tgt_lens)} target lengths")
    d, qk, v = cfg.d_model, cfg.h * cfg.resolved_d_k, cfg.h * cfg.resolved_d_v
    per_position = d * (2 * qk + v) + v * d + 2 * d * cfg.d_ff  # W_Q, W_K, W_V, W_O; W_1, W_2
    per_pair = qk + v  # Q K^T and the weighted sum of V, per (query, key)
    S, T = sum(src_lens), sum(tgt_lens)
    SS = sum(s * s for s in src_lens)
    TT = sum(t * t for t in tgt_lens)
    TS = sum(t * s for s, t in zip(src_lens, tgt_lens))
    enc = cfg.N_enc * (S * per_position + SS * per_pair)
    dec = cfg.N_dec * (
        T * per_position
        + TT * per_pair  # masked self-attention, the full square
        + T * (d * qk + v * d)
        + S * d * (qk + v)  # cross-attention: queries, outputs; memory K, V
        + TS * per_pair
    )
    return 2.0 * (enc + dec + T * d * cfg.vocab_size)


def real_lengths(tokens: torch.Tensor, pad_id: int) -> list[int]:
    """Non-pad positions of each row of a right-padded (B, L) batch: what ``training_flops``
    counts (pass ``src`` and ``tgt_out``)."""
    return (tokens != pad_id).sum(1).tolist()


def training_flops(cfg: ModelConfig, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> float:
    """Forward + backward = 3 x forward (the backward pass costs two matmuls per forward one)."""
    return 3.0 * forward_flops(cfg, src_lens, tgt_lens)


PROBE_SIDE = 256  # the matmul timed first, to size the measure's squares


def square_side(probe_seconds: float, largest: int, seconds: float) -> int:
    """The largest power-of-two side up to ``largest`` (at least ``PROBE_SIDE``) whose square
    matmul, at the speed of a ``PROBE_SIDE`` one that took ``probe_seconds``, takes at most
    ``seconds``: a slow path (bf16 where the CPU emulates it: minutes for one 2048 matmul,
    docs/benchmarks.md) keeps the measure within its time. A small matmul runs below the peak,
    so the estimate errs long; with the default second, fp32 keeps 2048 from 17 GFLOP/s at
    the probe's size."""
    n = largest
    while n > PROBE_SIDE and probe_seconds * (n / PROBE_SIDE) ** 3 > seconds:
        n //= 2
    return n


def measure_matmul_peak(
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    seconds: float = 1.0,
    trials: int = 5,
) -> float:
    """Sustained FLOP/s of square matmuls (2048 on CPU, 4096 on CUDA; smaller where one of
    those would not fit in ``seconds``, ``square_side``) on ``device`` in the training dtype
    (default: fp32 on CPU, bf16 on CUDA) on the current threads: the denominator of MFU.

    The best of ``trials`` windows of ``seconds / trials`` each: on a shared machine one window
    can catch a moment of contention, and a peak is what the hardware can do.
    """
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    probe = torch.randn(PROBE_SIDE, PROBE_SIDE, device=device, dtype=dtype)
    torch.matmul(probe, probe)  # the first call pays for the library's set-up
    _sync(device)
    start = time.perf_counter()
    torch.matmul(probe, probe)
    _sync(device)
    n = square_side(time.perf_counter() - start, 4096 if device.type == "cuda" else 2048, seconds)
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


def mfu(flops: float, seconds: float, peak_flops: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: ``flops`` counted by ``training_flops`` over what ``devices``
    devices at ``peak_flops`` could have done in ``seconds`` (the paper's cost estimate)."""
    return flops / paper_cost(seconds, devices, peak_flops)


def count_parameters(cfg: ModelConfig) -> int:
    """Trainable parameters of ``Transformer(cfg)``, counted analytically (tied matrix once)."""
    d, v = cfg.d_model, cfg.vocab_size
    qk, vv = cfg.h * cfg.resolved_d_k, cfg.h * cfg.resolved_d_v
    self_attn = d * (2 * qk + vv) + (2 * qk + vv) + vv * d + d
    src_attn = d * qk + qk + d * (qk + vv) + (qk + vv) + vv * d + d
    ffn = d * cfg.d_ff + cfg.d_ff + cfg.d_ff * d + d
    norm = 2 * d
    encoder = cfg.N_enc * (self_attn + ffn + 2 * norm)
    decoder = cfg.N_dec * (self_attn + src_attn + ffn + 3 * norm)
    embeddings = v * d * (1 if cfg.share_embeddings else 2)
    positions = 2 * cfg.max_len * d if cfg.positional == "learned" else 0
    final_norms = 2 * norm if cfg.norm == "pre" else 0
    output_bias = v if cfg.output_bias else 0
    return encoder + decoder + embeddings + positions + final_norms + output_bias
