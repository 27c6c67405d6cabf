"""The fast paths: faster kernels for the slots the model declares (``model.Kernels``), on the
CPU and in low precision.

``use_fast_paths(model)`` gives them to a model (``aiayn.runtime``'s doors: for training, for
decoding); ``aiayn.model`` itself computes what the paper says with PyTorch's fused attention,
``nn.Dropout`` and every key-padding mask given. What they change is speed, not the function:

- attention (``fused_attention``): bf16 on a CPU computed in fp32 (``attention_precision``), the
  projections cast once (``for_attention``), or two bf16 matmuls where training chose them
  (``BF16_MATMULS``, ``bf16_matmul_attention``);
- dropout (``UniformDropout``): the CPU mask drawn from 16-bit integers (``keep_mask``);
- key padding (``key_padding``): no mask when no key is padding (the fused kernel is faster).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import Kernels, Transformer, attention_mask

ModuleT = TypeVar(
    "ModuleT", bound=nn.Module
)  # the runtime's doors return the model they were given


def use_fast_paths(model: ModuleT) -> ModuleT:
    """Every ``Transformer`` of ``model`` computing with this module's kernels (``fast_kernels``,
    through ``Transformer.use_kernels``), in place; what its decode step's attention computes
    in (``decode_attention``) kept. The weights (and so the state dict) are untouched."""
    for module in list(model.modules()):
        if isinstance(module, Transformer):
            module.use_kernels(fast_kernels(module.kernels.decode_attention))
    return model


def fast_kernels(decode_attention: str | None = None) -> Kernels:
    """The model's slots (``Kernels``) filled with this module's kernels."""
    return Kernels(
        attention_cast=for_attention,
        attention=attention_kernel,
        key_padding=key_padding,
        dropout=UniformDropout,
        decode_attention=decode_attention,
    )


# --- Attention: precision and kernels --------------------------------------------------------


def attention_kernel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float = 1.0,
) -> Tensor:
    """``fused_attention`` with ``F.scaled_dot_product_attention``'s arguments, the contract of
    the model's attention slot (``Kernels.attention``)."""
    return fused_attention(q, k, v, attn_mask, scale, dropout_p, is_causal)


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention``, the same function as ``reference_attention``; bf16 on
    a CPU is computed in fp32 (``attention_precision``), autocast or not, and returned in bf16,
    unless training chose ``matmul_attention`` (``BF16_MATMULS``)."""
    precision = attention_precision(q.device, q.dtype)
    if precision == BF16_MATMULS:
        return matmul_attention(q, k, v, mask, scale, dropout_p, is_causal)
    # fp32 inputs too under CPU autocast, which would run SDPA in bf16
    autocast = q.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    if precision == "fp32" and (q.dtype != torch.float32 or autocast):
        with torch.autocast("cpu", enabled=False):
            out = fused_attention(
                q.float(), k.float(), v.float(), mask, scale, dropout_p, is_causal
            )
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )


def matmul_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``reference_attention`` with Q K^T and P V as bf16 matmuls around a softmax of bf16 in
    and out, its exponentials summed in fp32 (PyTorch's CPU kernel; its backward likewise): on a
    CPU with native bf16 PyTorch's bf16 flash backward is several times slower than fp32's, while
    two bf16 matmuls are faster than either (docs/training.md). The scores are rounded to bf16
    once, after the scaling, and the probabilities once, as P V's matmul needs them; no cast
    of the (B, h, T, S) tensors either way (an fp32 softmax cost four a call, forward and back).

    q: (B, h, T, d_k), k: (B, h, S, d_k), v: (B, h, S, d_v), bf16; mask broadcastable to
    (B, h, T, S), True = may attend -> (B, h, T, d_v), bf16.
    """
    B, h, T, d_k = q.shape
    S = k.size(2)
    with torch.autocast("cpu", enabled=False):
        keys = k.flatten(0, 1).transpose(1, 2)  # (B*h, d_k, S)
        scores = torch.baddbmm(  # (B*h, T, S), scaled in the matmul's fp32 accumulator
            q.new_zeros(()).expand(B * h, T, S), q.flatten(0, 1), keys, beta=0, alpha=scale
        ).view(B, h, T, S)
        if is_causal:
            mask = attention_mask(T, S, q.device, causal=True)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # illegal connections -> -inf
        weights = torch.softmax(scores, dim=-1)  # (B, h, T, S), bf16
        if dropout_p:  # the mask is fp32 (keep_mask): the product rounded back once
            weights = (weights * keep_mask(weights.shape, dropout_p)).to(q.dtype)
        return torch.matmul(weights, v)  # (B, h, T, d_v)


def for_attention(t: Tensor) -> Tensor:
    """``t`` in what attention computes in (``attention_precision``): a projection cast once,
    before it is split into q, k, v and heads, so that autograd casts its gradient once too."""
    return t.float() if attention_precision(t.device, t.dtype) == "fp32" else t


BF16_MATMULS = "bf16 matmuls and softmax"  # matmul_attention: a choice of training on a CPU
_cpu_bf16_matmuls = contextvars.ContextVar("cpu_bf16_matmuls", default=False)


@contextlib.contextmanager
def bf16_matmul_attention(enabled: bool = True) -> Iterator[None]:
    """Within it, attention under CPU bf16 autocast is ``matmul_attention`` (``BF16_MATMULS``):
    the trainer's choice where it measured to pay, entered with its autocast. Decoding and any
    forward outside it keep ``attention_precision``'s default."""
    token = _cpu_bf16_matmuls.set(enabled)
    try:
        yield
    finally:
        _cpu_bf16_matmuls.reset(token)


def attention_precision(device: torch.device, dtype: torch.dtype) -> str:
    """What attention computes in for activations of ``dtype``: fp32 on a CPU whatever the
    model's dtype, because PyTorch's CPU attention kernels are slower in bf16 than in fp32 (its
    flash backward several times over; docs/training.md), so two casts cost less than they
    save; ``BF16_MATMULS`` for bf16 under CPU autocast inside ``bf16_matmul_attention``
    (training); elsewhere the activations' own dtype. Decoding may choose its own for the
    decoder (``decode_attention``, ``aiayn.decode.cache``): there no backward is run."""
    if device.type == "cpu":
        if dtype == torch.bfloat16 and _cpu_bf16_matmuls.get() and torch.is_autocast_enabled("cpu"):
            return BF16_MATMULS
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


# --- Key padding -----------------------------------------------------------------------------


def key_padding(src_mask: Tensor) -> Tensor | None:
    """``src_mask`` (B, 1, 1, S), or None when no key is padding (the fused kernel is faster
    without a mask). Looked at on the CPU only, where the mask is in host memory: on a GPU
    reading it would wait for the device at every forward, so there the mask is always given
    (the fused kernels take it)."""
    if src_mask.device.type != "cpu":
        return src_mask
    return None if bool(src_mask.all()) else src_mask


# --- Dropout (5.4) ---------------------------------------------------------------------------


class UniformDropout(nn.Dropout):
    """nn.Dropout (5.4), with the CPU keep-mask drawn from uniform 16-bit integers
    (``keep_mask``); other devices, and compiled graphs, keep ``F.dropout`` and its fused kernel.

    The output of a bf16 input is fp32 (the mask is), which is what the residual sum it feeds
    computes in anyway.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x  # what F.dropout returns here, without a call per sub-layer when decoding
        if x.device.type != "cpu" or self.p == 1.0 or torch.compiler.is_compiling():
            return super().forward(x)
        return x * keep_mask(x.shape, self.p)


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """A CPU dropout mask of ``shape``, float32: 0 with probability p rounded to a multiple of
    2^-16 (0.1 -> 0.100006), else 1 / the keep probability, so the expectation is the input's.

    16 random bits an element, four to one 64-bit draw of the CPU generator (mt19937, 32 bits a
    call), where ``uniform_`` spends a call per element and ``bernoulli_`` more (outside MKL's
    Intel-only path). In fp32 the threshold and scale are exact for any input dtype: compared in
    bf16, ``uniform < 0.9`` keeps 89.8% and scales by 1.109, an expectation 0.3% short.
    """
    n, levels = math.prod(shape), 1 << 16
    dropped = min(round(p * levels), levels - 1)
    draws = torch.empty(-(-n // 4), dtype=torch.int64).random_(-(2**63), None)
    lanes = draws.view(torch.int16)[:n].view(shape)  # (ceil(n/4),) int64 -> (n,) int16 -> shape
    return torch.where(lanes >= dropped - levels // 2, levels / (levels - dropped), 0.0)
