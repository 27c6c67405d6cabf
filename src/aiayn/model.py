"""The Transformer, in the order of section 3 of "Attention Is All You Need": the encoder
and decoder stacks (3.1), attention (3.2), the feed-forward networks (3.3), embeddings and
positional encoding (3.4, 3.5), dropout (5.4), then the model (Figure 1) and, last, the
key/value cache that incremental decoding needs.

Tensors are batch-first. Masks follow one convention, that of
``F.scaled_dot_product_attention``: boolean ``True`` means "may attend".

    src (B, S) -> embed * sqrt(d_model) + PE -> dropout -> N_enc x EncoderLayer -> memory
    tgt_in (B, T) -> same embedding path -> N_dec x DecoderLayer(memory) -> W_emb^T -> logits

Post-LN by default: every sub-layer is ``LayerNorm(x + Dropout(Sublayer(x)))`` (section 3.1,
5.4). ``norm="pre"`` is a labelled deviation. This module imports only torch and the config.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import Init, ModelConfig

# --- 3.1 Encoder and decoder stacks -----------------------------------------------------
# Each sub-layer is LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the paper), or with
# ``norm="pre"`` x + Dropout(Sublayer(LayerNorm(x))); ``forward`` shows which, as PyTorch's
# ``norm_first`` does, and each norm is named for the sub-layer it belongs to.


class EncoderLayer(nn.Module):
    """Multi-head self-attention, then the feed-forward network (Figure 1, left)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = UniformDropout(cfg.P_drop)  # 5.4: residual dropout
        self.norm_first = cfg.norm == "pre"

    def forward(
        self, x: Tensor, mask: Tensor | None, weights: list[Tensor] | None = None
    ) -> Tensor:
        """x: (B, S, d_model) -> (B, S, d_model); ``weights`` gets the attention weights."""
        if self.norm_first:
            x = x + self._self_attention(self.self_attn_norm(x), mask, weights)
            return x + self._feed_forward(self.ffn_norm(x))
        x = self.self_attn_norm(x + self._self_attention(x, mask, weights))
        return self.ffn_norm(x + self._feed_forward(x))

    def _self_attention(
        self, x: Tensor, mask: Tensor | None, weights: list[Tensor] | None
    ) -> Tensor:
        return self.dropout(self.self_attn(x, mask, weights=weights))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.feed_forward(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Figure 1, right).

    ``forward`` runs whole target sequences (training, teacher forcing); ``step`` runs the new
    position(s) of incremental decoding against a ``LayerCache``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.src_attn = MultiHeadAttention(cfg, self_attention=False)
        self.src_attn_norm = nn.LayerNorm(cfg.d_model)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = UniformDropout(cfg.P_drop)  # 5.4: residual dropout
        self.norm_first = cfg.norm == "pre"

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        memory_mask: Tensor | None,
        is_causal: bool = False,
        weights: tuple[list[Tensor], list[Tensor]] | None = None,
    ) -> Tensor:
        """y: (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model). ``weights``: two lists
        that get the self- and encoder-decoder attention weights (see ``MultiHeadAttention``)."""
        self_w, src_w = weights if weights is not None else (None, None)

        def self_attention(y: Tensor) -> Tensor:
            return self.self_attn(y, self_mask, is_causal=is_causal, weights=self_w)

        def src_attention(y: Tensor) -> Tensor:
            kv = self.src_attn.project_kv(memory)
            return self.src_attn(y, memory_mask, memory_kv=kv, weights=src_w)

        return self._sublayers(y, self_attention, src_attention)

    def step(self, y: Tensor, cache: LayerCache, step: Step) -> Tensor:
        """y: (n*b, m, d_model), the m new positions of every row -> (n*b, m, d_model)."""
        return self._sublayers(
            y,
            lambda y: self.self_attn.step_self(y, cache, step),
            lambda y: self.src_attn.step_src(y, cache, step),
        )

    def _sublayers(
        self,
        y: Tensor,
        self_attention: Callable[[Tensor], Tensor],
        src_attention: Callable[[Tensor], Tensor],
    ) -> Tensor:
        if self.norm_first:
            y = y + self.dropout(self_attention(self.self_attn_norm(y)))
            y = y + self.dropout(src_attention(self.src_attn_norm(y)))
            return y + self.dropout(self.feed_forward(self.ffn_norm(y)))
        y = self.self_attn_norm(y + self.dropout(self_attention(y)))
        y = self.src_attn_norm(y + self.dropout(src_attention(y)))
        return self.ffn_norm(y + self.dropout(self.feed_forward(y)))


# --- 3.2.1 Scaled dot-product attention -------------------------------------------------


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale) V, written out so that the weights can be returned.

    q: (B, h, T, d_k), k: (B, h, S, d_k), v: (B, h, S, d_v), mask: broadcastable to (B, h, T, S),
    True = may attend. Returns (output (B, h, T, d_v), weights (B, h, T, S)).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, h, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # illegal connections -> -inf
    weights = torch.softmax(scores, dim=-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights, v), weights


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
    decoder (``Transformer.decode_attention``): there no backward is run."""
    if device.type == "cpu":
        if dtype == torch.bfloat16 and _cpu_bf16_matmuls.get() and torch.is_autocast_enabled("cpu"):
            return BF16_MATMULS
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def cached_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """softmax(Q K^T * scale + bias) V for the few new queries of a decode step, as two batched
    matrix products: for one query a fused attention kernel costs several times its arithmetic.

    q: (n, h, Q, d_k), k: (n, h, K, d_k), v: (n, h, K, d_v) -> (n, h, Q, d_v); bias: (n*h, Q, K)
    or broadcastable to it, 0 where a query may attend and -inf elsewhere.
    """
    n, h, Q, d_k = q.shape
    keys = k.flatten(0, 1).transpose(1, 2)  # (n*h, d_k, K), a view of the cache
    scores = torch.baddbmm(bias, q.reshape(n * h, Q, d_k), keys, alpha=scale)  # (n*h, Q, K)
    return torch.bmm(torch.softmax(scores, dim=-1), v.flatten(0, 1)).view(n, h, Q, -1)


# --- 3.2.2 Multi-head attention ---------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O, head_i = Attention(Q W_Q^i, ...).

    The h per-head projections are stored as one matrix per role (W_Q: d_model -> h*d_k, ...),
    which is the same parameters as h separate ones. For self-attention W_Q, W_K and W_V are
    stacked into ``W_QKV`` so that one matmul computes all three; for encoder-decoder attention
    W_K and W_V are stacked into ``W_KV``, applied once per sentence to the encoder output.
    """

    def __init__(self, cfg: ModelConfig, self_attention: bool) -> None:
        super().__init__()
        self.h, self.d_k, self.d_v = cfg.h, cfg.resolved_d_k, cfg.resolved_d_v
        self.scale = 1.0 / math.sqrt(self.d_k) if cfg.scale_attention else 1.0
        self.dropout_p = cfg.attention_dropout
        self.self_attention = self_attention
        qk, v = self.h * self.d_k, self.h * self.d_v
        if self_attention:
            self.W_QKV = nn.Linear(cfg.d_model, 2 * qk + v)
        else:
            self.W_Q = nn.Linear(cfg.d_model, qk)
            self.W_KV = nn.Linear(cfg.d_model, qk + v)
        self.W_O = nn.Linear(v, cfg.d_model)

    def reset_parameters(self, init: Init) -> None:
        """W_O: Xavier-uniform, bias 0. W_Q, W_K, W_V: "xavier" treats a stacked matrix (W_QKV,
        W_KV) as one; "fairseq" draws each of W_Q, W_K, W_V as its own Xavier-uniform matrix with
        gain 1/sqrt(2) (on W_QKV that equals Xavier on the stack) and gives them PyTorch's default
        biases, U(+-1/sqrt(d_model)), instead of 0."""
        qk, v = self.h * self.d_k, self.h * self.d_v
        stacks = (
            [(self.W_QKV, [qk, qk, v])]
            if self.self_attention
            else [(self.W_Q, [qk]), (self.W_KV, [qk, v])]
        )
        for linear, sizes in stacks:
            if init == "xavier":
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)
                continue
            with torch.no_grad():
                for block in linear.weight.split(
                    sizes, dim=0
                ):  # (rows of W_Q / W_K / W_V, d_model) views
                    nn.init.xavier_uniform_(block, gain=2**-0.5)
            bound = linear.in_features**-0.5
            nn.init.uniform_(linear.bias, -bound, bound)
        nn.init.xavier_uniform_(self.W_O.weight)
        nn.init.zeros_(self.W_O.bias)

    def _heads(self, x: Tensor, d: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.h, d).transpose(1, 2)  # (B, L, h*d) -> (B, h, L, d)

    def project_kv(self, memory: Tensor, cast: bool = True) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values: (n, S, d_model) -> 2 x (n, h, S, d), views; in what
        attention computes in (``for_attention``), or with ``cast`` False in the projection's
        dtype, for a caller that casts them as it lays them out (``new_cache``: one copy)."""
        kv = self.W_KV(memory)
        kv = for_attention(kv) if cast else kv
        k, v = kv.split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        """x: (B, T, d_model) -> (B, T, d_model).

        Self-attention: keys and values come from x. Encoder-decoder attention: they are
        ``memory_kv`` (B, h, S, d) (see ``project_kv``). ``weights``: a list that gets this
        call's attention weights (B, h, T, S), computed by ``reference_attention`` (slower than
        the fused kernel, so only on request: attention maps, alignments).
        """
        T, qk = x.size(1), self.h * self.d_k
        if self.self_attention:
            q, k, v = for_attention(self.W_QKV(x)).split([qk, qk, self.h * self.d_v], dim=-1)
            q, k, v = self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)
        else:
            assert memory_kv is not None, "encoder-decoder attention needs the memory's k, v"
            k, v = memory_kv
            q = self._heads(for_attention(self.W_Q(x)), self.d_k)
        dropout_p = self.dropout_p if self.training else 0.0
        if weights is not None:
            if is_causal:
                mask = attention_mask(T, k.size(2), q.device, causal=True)
            out, w = reference_attention(q, k, v, mask, self.scale, dropout_p)
            weights.append(w)
        else:
            out = fused_attention(q, k, v, mask, self.scale, dropout_p, is_causal)
        return self._concat(out, x)  # (B, h, T, d_v) -> W_O of the concatenated heads

    def step_self(self, x: Tensor, cache: LayerCache, step: Step) -> Tensor:
        """Self-attention of the m new positions of n*b rows, x: (n*b, m, d_model) ->
        (n*b, m, d_model). Their keys and values are written into the cache's slots (see
        ``DecoderCache``); each sentence's b*m queries then attend together over every slot of
        its history, ``step.self_bias`` hiding the slots that are not the query's own prefix."""
        n, b, m = step.sentences, step.beams, x.size(1)
        h, d_k, d_v = self.h, self.d_k, self.d_v
        q, k, v = self.W_QKV(x).split([h * d_k, h * d_k, h * d_v], dim=-1)  # (B, m, h*d) each
        t = step.start
        # (n*b, m, h*d) -> (n, h, m, b, d): position t+j of beam s at slot [.., t + j, s]
        cache.write(
            k.view(n, b, m, h, d_k).permute(0, 3, 2, 1, 4),
            v.view(n, b, m, h, d_v).permute(0, 3, 2, 1, 4),
            t,
        )
        keys = cache.keys[:, :, step.first : t + m].flatten(2, 3)  # (n, h, P*W, d_k), a view
        values = cache.values[:, :, step.first : t + m].flatten(2, 3)
        q = self._query_heads(q.view(n, b * m, h, d_k), keys.dtype)  # (n, h, b*m, d_k)
        return self._concat(cached_attention(q, keys, values, step.self_bias, self.scale), x)

    def step_src(self, x: Tensor, cache: LayerCache, step: Step) -> Tensor:
        """Encoder-decoder attention of n*b rows, x: (n*b, m, d_model) -> (n*b, m, d_model):
        the b*m queries of a sentence attend together over its memory's keys and values,
        projected once (``new_cache``) and shared by its beams."""
        n, (B, m, _) = step.sentences, x.shape
        k, v = cache.memory_keys, cache.memory_values
        q = self._query_heads(self.W_Q(x).view(n, B // n * m, self.h, self.d_k), k.dtype)
        return self._concat(cached_attention(q, k, v, step.memory_bias, self.scale), x)

    @staticmethod
    def _query_heads(q: Tensor, dtype: torch.dtype) -> Tensor:
        """(n, b*m, h, d_k) -> (n, h, b*m, d_k) in the cache's dtype: the batched product needs
        the heads laid out as its batch, and a cast lays them out so in the same copy (without
        a cast it is a view, and the product's reshape makes that copy)."""
        return q.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)

    def _concat(self, out: Tensor, x: Tensor) -> Tensor:
        """Heads (B, h, T, d_v) of x (B, T, d_model), or (n, h, b*m, d_v) of the rows of x
        (n*b, m, d_model) in a decode step -> W_O of their concat; a cast back to x's dtype lays
        the heads side by side in the same copy (else the reshape would copy too). Under
        autocast the cast is to W_O's compute dtype: to x's fp32 and back would cast twice."""
        B, T, _ = x.shape
        device = x.device.type
        autocast = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else x.dtype
        out = out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)
        return self.W_O(out.reshape(B, T, self.h * self.d_v))  # (B, T, h, d_v) -> (B, T, h*d_v)


# --- 3.2.3 Applications of attention: which positions a query may attend ---------------
# True = may attend, as in F.scaled_dot_product_attention.


def attention_mask(
    T: int,
    S: int,
    device: torch.device,
    *,
    causal: bool = False,
    window: int | None = None,
    keys: Tensor | None = None,
) -> Tensor | None:
    """The mask of T queries, the last T of S positions, over the S keys; None if none is masked.

    ``causal``: query i sees keys j <= i (3.2.3: the decoder may not look ahead).
    ``window`` = r: only keys with |i - j| <= r (restricted self-attention, Table 1).
    ``keys`` (B, 1, 1, S): key padding (see ``key_padding``), combined with the above.
    Returns (T, S), or (B, 1, T, S) with ``keys``. With a window and padding a padded query may
    see no key at all; it also sees itself so that its softmax stays finite (its output is
    padding and never read).
    """
    i = torch.arange(S - T, S, device=device)[:, None]  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    mask = (j <= i) if causal else None
    if window is not None:
        near = (i - j).abs() <= window
        mask = near if mask is None else mask & near
    if keys is not None:
        mask = keys if mask is None else (mask & keys) | (i == j)
    return mask


def key_padding(src_mask: Tensor) -> Tensor | None:
    """``src_mask`` (B, 1, 1, S), or None when no key is padding (the fused kernel is faster
    without a mask). Looked at on the CPU only, where the mask is in host memory: on a GPU
    reading it would wait for the device at every forward, so there the mask is always given
    (the fused kernels take it)."""
    if src_mask.device.type != "cpu":
        return src_mask
    return None if bool(src_mask.all()) else src_mask


# --- 3.3 Position-wise feed-forward networks --------------------------------------------


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, inner size d_ff."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.W_1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.W_2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def reset_parameters(self, init: Init) -> None:
        """ "xavier": Xavier-uniform weights, biases 0. "fairseq": ``nn.Linear``'s default, weights
        and biases U(+-1/sqrt(fan_in)), which makes W_2 (fan_in d_ff) ~2x smaller than Xavier, so
        each sub-layer starts closer to the identity."""
        for linear in (self.W_1, self.W_2):
            if init == "fairseq":
                linear.reset_parameters()
            else:
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.W_2(F.relu(self.W_1(x)))


# --- 3.4 Embeddings and softmax, 3.5 Positional encoding ---------------------------------


def sinusoidal_encoding(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...): (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div)[:, : d_model // 2]
    return pe.float()


class Embedding(nn.Module):
    """Token embedding * sqrt(d_model) + positional encoding, then dropout (5.4)."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model)
        self.max_len = cfg.max_len
        if cfg.positional == "learned":
            self.learned = nn.Embedding(cfg.max_len, cfg.d_model)
            nn.init.normal_(self.learned.weight, std=cfg.d_model**-0.5)
        else:
            self.register_buffer(
                "pe", sinusoidal_encoding(cfg.max_len, cfg.d_model), persistent=False
            )
        self.dropout = UniformDropout(cfg.P_drop)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x: (B, L) token ids at positions start..start+L-1 -> (B, L, d_model)."""
        end = start + x.size(1)
        if end > self.max_len:
            raise ValueError(f"sequence of length {end} exceeds max_len={self.max_len}")
        pe = self.learned.weight[start:end] if hasattr(self, "learned") else self.pe[start:end]
        return self.dropout(self.tokens(x) * self.scale + pe)


# --- 5.4 Regularization: dropout --------------------------------------------------------


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


# --- The model -----------------------------------------------------------------------------


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Figure 1).

    ``forward`` is teacher-forced training; ``encode`` + ``decode_step`` is incremental decoding
    with a key/value cache, the interface the beam search depends on.
    """

    def __init__(self, cfg: ModelConfig, init: Init = "fairseq") -> None:
        super().__init__()
        self.cfg = cfg
        # 3.4: one weight matrix for the source embedding, target embedding and pre-softmax
        # projection (shared source/target vocabulary).
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tgt_tokens = (
            src_tokens
            if cfg.share_embeddings
            else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.src_embed = Embedding(cfg, src_tokens)
        self.tgt_embed = Embedding(cfg, tgt_tokens)
        self.encoder = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.N_enc)])
        self.decoder = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.N_dec)])
        # Pre-LN needs a final LayerNorm on each stack; the paper's post-LN has none.
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.generator.weight = tgt_tokens.weight  # tied: the same Parameter object
        # What the decoder's attention computes in while decoding (``new_cache``): None is
        # ``attention_precision``'s choice, as in training; a decoding precision may set its
        # own (``decode.precision.to_bf16``). The encoder's attention keeps the training path.
        self.decode_attention: str | None = None
        self.reset_parameters(init)

    def reset_parameters(self, init: Init = "fairseq") -> None:
        """Initial weights: embeddings N(0, d_model^-1/2) (so that embedding * sqrt(d_model) has unit
        variance), LayerNorms at identity, projections by ``init``.

        The paper does not say how its weights start. "fairseq" (see ``MultiHeadAttention`` and
        ``PositionwiseFeedForward``) learns much faster early on than "xavier" (Xavier-uniform
        projections, zero biases, as tensor2tensor-style reimplementations do); the measurements
        are in docs/experiments.md ("peers").
        """
        for module in self.modules():
            if isinstance(module, (MultiHeadAttention, PositionwiseFeedForward)):
                module.reset_parameters(init)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for emb in {id(e.tokens): e.tokens for e in (self.src_embed, self.tgt_embed)}.values():
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()

    @torch.no_grad()
    def attention_weights(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Per layer, the (h, T, S) weights of encoder self-, decoder self- and encoder-decoder
        attention for one sentence pair (src (1, S), tgt_in (1, T)), from the reference path,
        with dropout off; the model's mode is restored after."""
        was_training = self.training
        self.eval()
        names = ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")
        found: dict[str, list[Tensor]] = {name: [] for name in names}
        try:
            memory = self.encode(src, weights=found[names[0]])
            self.decode(
                tgt_in, memory, self.src_mask(src), weights=(found[names[1]], found[names[2]])
            )
        finally:
            self.train(was_training)
        return {name: [w[0] for w in layers] for name, layers in found.items()}

    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, 1, 1, S): True for real source tokens (keys that may be attended)."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, weights: list[Tensor] | None = None) -> Tensor:
        """src: (B, S) token ids -> memory (B, S, d_model). ``weights``: a list that gets each
        layer's attention weights (B, h, S, S) (``MultiHeadAttention``)."""
        S = src.size(1)
        mask = attention_mask(
            S, S, src.device, window=self.cfg.attention_window, keys=key_padding(self.src_mask(src))
        )
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, mask, weights)
        return self.enc_norm(x)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        weights: tuple[list[Tensor], list[Tensor]] | None = None,
    ) -> Tensor:
        """Teacher-forced decoder: tgt_in (B, T) -> states (B, T, d_model). ``weights``: two
        lists that get each layer's self- (B, h, T, T) and encoder-decoder (B, h, T, S)
        attention weights."""
        T, r = tgt_in.size(1), self.cfg.attention_window
        # Causal alone goes to the fused kernel as is_causal; a window needs an explicit mask.
        self_mask = (
            None if r is None else attention_mask(T, T, tgt_in.device, causal=True, window=r)
        )
        memory_mask = key_padding(src_mask)
        y = self.tgt_embed(tgt_in)
        for layer in self.decoder:
            y = layer(y, memory, self_mask, memory_mask, self_mask is None, weights)
        return self.dec_norm(y)

    def forward(self, src: Tensor, tgt_in: Tensor, output_mask: Tensor | None = None) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, vocab).

        With ``output_mask`` (B, T) bool, only the selected positions are projected onto the
        vocabulary and logits come back as (n_selected, vocab): the training loss skips the
        largest matmul for padding positions.
        """
        memory = self.encode(src)
        states = self.decode(tgt_in, memory, self.src_mask(src))
        if output_mask is not None:
            states = states[output_mask]
        return self.generator(states)

    # Incremental decoding (section 6's search): ``new_cache`` once per batch of sentences, then
    # ``decode_step`` once per output position.

    @torch.no_grad()
    def new_cache(
        self, memory: Tensor, src_mask: Tensor, max_len: int | None = None
    ) -> DecoderCache:
        """The cache that decoding ``memory`` (n, S, d_model) starts from, ``src_mask`` =
        ``self.src_mask(src)`` (n, 1, 1, S): each layer's encoder-decoder keys and values,
        projected once per sentence and shared by its beams, and room for ``max_len`` target
        positions (default, and at most, the model's); keys and values in what the decoder's
        attention computes in (``decode_attention``)."""
        capacity = min(max_len or self.cfg.max_len, self.cfg.max_len)
        precision = self.decode_attention or attention_precision(memory.device, memory.dtype)
        dtype = torch.float32 if precision == "fp32" else memory.dtype
        padding = key_padding(src_mask)
        bias = None
        if padding is not None:  # (n, h, 1, S): -inf on the padding, per head
            bias = torch.zeros(padding.shape, dtype=dtype, device=memory.device)
            bias = bias.masked_fill_(~padding, float("-inf")).expand(-1, self.cfg.h, -1, -1)
            bias = bias.contiguous()
        layers, contiguous = [], torch.contiguous_format
        for layer in self.decoder:
            k, v = layer.src_attn.project_kv(memory, cast=False)  # 2 x (n, h, S, d)
            # cast and laid out in one copy each (``copy``: also when the dtype is already it);
            # the keys stored (n, h, d, S), seen as (n, h, S, d)
            keys = k.transpose(2, 3).to(dtype, memory_format=contiguous, copy=True)
            values = v.to(dtype, memory_format=contiguous, copy=True)
            layers.append(LayerCache(keys.transpose(2, 3), values))
        return DecoderCache(layers, bias, capacity, self.cfg.attention_window)

    @torch.no_grad()
    def decode_state(self, tgt_in: Tensor, cache: DecoderCache) -> Tensor:
        """Feed the next target token(s) tgt_in (n*b, m) -> the decoder's output for the last of
        them (n*b, d_model), before the output projection; earlier positions come from
        ``cache``, which takes the new ones (so each call costs its new positions only). Rows
        are sentence-major: b consecutive rows (beams) per sentence of the cache."""
        step = cache.advance(tgt_in)
        y = self.tgt_embed(tgt_in, start=step.start)
        for layer, layer_cache in zip(self.decoder, cache.layers):
            y = layer.step(y, layer_cache, step)
        return self.dec_norm(y[:, -1])

    @torch.no_grad()
    def decode_step(self, tgt_in: Tensor, cache: DecoderCache) -> Tensor:
        """Feed the next target token(s) tgt_in (n*b, m) -> logits of the last one (n*b, vocab)
        (see ``decode_state``). Inference only: no gradients, the cache is written in place."""
        return self.generator(self.decode_state(tgt_in, cache))


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
    return encoder + decoder + embeddings + positions + final_norms


# --- Incremental decoding: the key/value cache behind ``decode_step`` (section 6's search) ---


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values: the encoder-decoder attention's (n, h, S, d),
    projected once per sentence, and the self-attention's in slots (n, h, capacity, W, d), made
    at the first step (see ``DecoderCache``); ``spare``: buffers that ``keep`` fills in turn.

    The memory's keys are stored transposed, (n, h, d, S) in memory and seen through a view as
    (n, h, S, d): the scores' product reads K^T, and MKL reads it 2-3x faster from contiguous
    rows than as a transposed operand (the demo's test split: the same outputs, their scores
    apart in the last bits). The slots keep the values' layout: a step writes one position,
    which a transposed layout would scatter over d rows."""

    memory_keys: Tensor
    memory_values: Tensor
    keys: Tensor = field(default_factory=lambda: torch.empty(0))
    values: Tensor = field(default_factory=lambda: torch.empty(0))
    spare: tuple[Tensor, Tensor] | None = None

    def make_room(self, width: int, capacity: int, filled: int) -> None:
        """Slots for ``width`` beams per position, more than before (the first step, and the
        beams fanning out), the ``filled`` positions kept; the slots those positions had not
        are zeros, so that every slot a query may read holds finite values (a slot it must
        not see gets weight 0, and 0 times a finite value is 0)."""
        if self.keys.dim() == 5 and self.keys.size(3) >= width:
            return
        k, v = self.memory_keys, self.memory_values
        n, h = k.shape[:2]
        old = (self.keys, self.values)
        self.keys = k.new_empty(n, h, capacity, width, k.size(3))
        self.values = v.new_empty(n, h, capacity, width, v.size(3))
        W = old[0].size(3) if old[0].dim() == 5 else 0
        for new, was in zip((self.keys, self.values), old):
            if W:
                new[:, :, :filled, :W] = was[:, :, :filled]
            new[:, :, :filled, W:] = 0
        self.spare = None

    def write(self, k: Tensor, v: Tensor, start: int) -> None:
        """k, v (n, h, m, b, d) at positions start.. of beams 0..b-1; the other slots of
        those positions (fewer beams than slots) are zeros (see ``make_room``)."""
        end, b = start + k.size(2), k.size(3)
        self.keys[:, :, start:end, :b] = k
        self.values[:, :, start:end, :b] = v
        if b < self.keys.size(3):
            self.keys[:, :, start:end, b:] = 0
            self.values[:, :, start:end, b:] = 0

    def keep(
        self, sentences: Tensor, filled: int, moves: tuple[list[int], list[int]] | None
    ) -> None:
        """Only these sentences (n',) go on: their memory k/v, and their ``filled`` positions
        gathered into the spare buffers, which then become the current ones; or, given
        ``moves`` (``tail_moves``: ``sentences`` only fills holes among the first n' from after
        them), just the movers copied into the holes, in place, one copy of a sentence's
        contiguous rows each (the few movers of a step: several times faster than indexing)."""
        if moves is not None:
            n = sentences.numel()
            for name in ("memory_keys", "memory_values", "keys", "values"):
                buffer = getattr(self, name)
                if buffer.dim() == 5:  # the self-attention's slots: only the filled positions
                    buffer = buffer[:, :, :filled]
                if buffer.numel():
                    for hole, mover in zip(*moves):
                        buffer[hole] = buffer[mover]
                setattr(self, name, getattr(self, name)[:n])
            return
        stored = self.memory_keys.transpose(2, 3)  # (n, h, d, S), contiguous
        self.memory_keys = stored.index_select(0, sentences).transpose(2, 3)
        self.memory_values = self.memory_values.index_select(0, sentences)
        if self.keys.dim() != 5:
            return
        n = sentences.numel()
        if self.spare is None or self.spare[0].size(0) < n:
            self.spare = (
                self.keys.new_empty(n, *self.keys.shape[1:]),
                self.values.new_empty(n, *self.values.shape[1:]),
            )
        for old, new in zip((self.keys, self.values), self.spare):
            torch.index_select(old[:, :, :filled], 0, sentences, out=new[:n, :, :filled])
        (self.keys, self.values), self.spare = (
            (self.spare[0][:n], self.spare[1][:n]),
            (self.keys, self.values),
        )


def tail_moves(sentences: Tensor) -> tuple[list[int], list[int]] | None:
    """For ``sentences`` (n',) that keeps sentence i at place i but for holes filled from
    places >= n' (what ``beam`` asks when sentences finish): (holes, movers), the places
    written and the sentences moved into them; None for any other order."""
    n = sentences.numel()
    holes = (sentences != torch.arange(n, device=sentences.device)).nonzero().squeeze(1)
    movers = sentences[holes]
    return (holes.tolist(), movers.tolist()) if bool((movers >= n).all()) else None


@dataclass
class Step:
    """What the layers of one ``decode_step`` share: n sentences of b rows (beams) each, new
    positions from ``start``, queries that may see positions from ``first`` on; the additive
    masks (0 or -inf) of self-attention over the slots, (n*h, b*m, P*W) for P positions of W
    slots, and of encoder-decoder attention, (n*h, 1, S) or (1, 1, 1) without padding."""

    sentences: int
    beams: int
    start: int
    first: int
    self_bias: Tensor
    memory_bias: Tensor


class DecoderCache:
    """The keys and values of incremental decoding, where a search's beams share their history.

    Rows are sentence-major: row = sentence * b + beam. The self-attention keys and values of
    position p of beam j of sentence i are written once, to slot [i, :, p, j] of each layer's
    buffers (n, h, capacity, W, d), and never moved when the search reorders its beams:
    ``ancestry`` (n*b, positions) long holds, per row and position, the slot (beam) of its
    prefix that holds it, so a reorder (``select``) copies only that. A new query of a sentence
    attends over all the sentence's slots (its b*m queries together, one batched product over
    keys read once) and the step's mask hides the slots that are not its own prefix: W times
    the arithmetic of each row reading its own history, which would have to be gathered (read
    and written) per step. The memory's keys and values are one per sentence, shared by its
    beams, and are copied only when sentences leave.
    """

    def __init__(
        self,
        layers: list[LayerCache],
        memory_bias: Tensor | None,
        capacity: int,
        window: int | None,
    ) -> None:
        self.layers, self.memory_bias = layers, memory_bias
        self.no_bias = layers[0].memory_keys.new_zeros(1, 1, 1)  # the mask without padding
        self.hidden = self.no_bias.new_full((), float("-inf"))  # a masked slot, in its dtype
        self.capacity, self.window = capacity, window
        self.step = 0  # target positions already seen
        self.ancestry: Tensor | None = None  # (rows, step), from the first step

    def advance(self, tgt_in: Tensor) -> Step:
        """Take the next m positions of every row (tgt_in (n*b, m)): slots for them, each row's
        ancestry extended by its own beam, and the step's masks."""
        (B, m), n = tgt_in.shape, self.layers[0].memory_keys.size(0)
        start, end, b = self.step, self.step + m, B // n
        if B != n * b or (self.ancestry is not None and self.ancestry.size(0) != B):
            raise ValueError(f"{B} rows for a cache of {n} sentences and {self.rows} rows")
        if end > self.capacity:
            raise ValueError(f"cache holds {self.capacity} positions, position {end} requested")
        for layer in self.layers:
            layer.make_room(b, self.capacity, start)
        own = (torch.arange(B, device=tgt_in.device) % b)[:, None].expand(B, m)  # (B, m) beam
        past = self.ancestry if self.ancestry is not None else own[:, :0]
        self.ancestry = torch.cat([past, own], dim=1)  # (B, end)
        self.step = end
        first = max(0, end - 1 - self.window) if self.window is not None and m == 1 else 0
        padded = self.memory_bias
        memory_bias = self.no_bias if padded is None else padded.flatten(0, 1)  # (n*h, 1, S)
        return Step(n, b, start, first, self._self_bias(m, first), memory_bias)

    @property
    def rows(self) -> int | None:
        return None if self.ancestry is None else self.ancestry.size(0)

    def _self_bias(self, m: int, first: int) -> Tensor:
        """(n*h, b*m, P*W): 0 where a new query may see a slot, -inf elsewhere; with one slot
        per position and one new query per row, it may see every slot (no mask)."""
        assert self.ancestry is not None
        keys = self.layers[0].keys
        (n, h), W, end = keys.shape[:2], keys.size(3), self.step
        if W == 1 and m == 1:
            return self.no_bias
        slots = torch.arange(W, device=keys.device)
        visible = self.ancestry[:, None, first:end, None] == slots  # (B, 1, P, W)
        if m > 1:  # several new positions: causal (and windowed) among themselves
            order = attention_mask(m, end, keys.device, causal=True, window=self.window)
            visible = visible & order[None, :, first:, None]  # (B, m, P, W)
        cells = (end - first) * W
        # (B, m, P, W) -> (n, 1, b*m, P*W), then one copy per head: half the work of filling
        # the (n, h, b*m, P*W) bias with -inf and masking it
        bias = torch.where(visible.view(n, 1, -1, cells), 0.0, self.hidden)
        return bias.expand(-1, h, -1, -1).reshape(n * h, -1, cells)

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep/reorder target rows (beams), and with ``sentences`` the sentences too.

        ``rows`` (B',) long: target row i becomes old row rows[i], which must be a row of the
        same sentence (a beam reordered within its sentence, the beam fanning out from 1 to k,
        beams of finished sentences leaving). ``sentences`` (n',) long: the sentences that stay,
        in their new order (an order that only fills holes from the tail, as ``beam`` gives,
        moves only the movers: ``tail_moves``); leave it None while the sentences stay as they
        are: then nothing but the ancestry is copied.
        """
        if self.ancestry is not None:
            self.ancestry = self.ancestry.index_select(0, rows)
        if sentences is None:
            return
        moves = tail_moves(sentences)
        for layer in self.layers:
            layer.keep(sentences, self.step, moves)
        if self.memory_bias is not None:
            self.memory_bias = self.memory_bias.index_select(0, sentences)  # (n', h, 1, S): small
