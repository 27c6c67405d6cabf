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

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import Init, ModelConfig

AttentionImpl = Literal["fused", "reference"]


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

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x: (B, S, d_model) -> (B, S, d_model)."""
        if self.norm_first:
            x = x + self._self_attention(self.self_attn_norm(x), mask)
            return x + self._feed_forward(self.ffn_norm(x))
        x = self.self_attn_norm(x + self._self_attention(x, mask))
        return self.ffn_norm(x + self._feed_forward(x))

    def _self_attention(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.dropout(self.self_attn(x, mask))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.feed_forward(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Figure 1, right)."""

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
        cache: LayerCache | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """y: (B, T, d_model); memory (n, S, d_model) with B = n*b (see ``MultiHeadAttention``)."""
        self_kv = cache.self_kv if cache is not None else None
        memory_kv = self._memory_kv(memory, cache)
        if self.norm_first:
            y = y + self._self_attention(self.self_attn_norm(y), self_mask, self_kv, is_causal)
            y = y + self._src_attention(self.src_attn_norm(y), memory_kv, memory_mask)
            return y + self._feed_forward(self.ffn_norm(y))
        y = self.self_attn_norm(y + self._self_attention(y, self_mask, self_kv, is_causal))
        y = self.src_attn_norm(y + self._src_attention(y, memory_kv, memory_mask))
        return self.ffn_norm(y + self._feed_forward(y))

    def _memory_kv(self, memory: Tensor, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        """The memory's keys and values, projected once per sentence when decoding."""
        if cache is not None and cache.memory_kv is not None:
            return cache.memory_kv
        memory_kv = self.src_attn.project_kv(memory)
        if cache is not None:
            cache.memory_kv = memory_kv
        return memory_kv

    def _self_attention(
        self, y: Tensor, mask: Tensor | None, cache: KVCache | None, is_causal: bool
    ) -> Tensor:
        return self.dropout(self.self_attn(y, mask, cache=cache, is_causal=is_causal))

    def _src_attention(
        self, y: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor | None
    ) -> Tensor:
        return self.dropout(self.src_attn(y, mask, memory_kv=memory_kv))

    def _feed_forward(self, y: Tensor) -> Tensor:
        return self.dropout(self.feed_forward(y))


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
    a CPU is computed in fp32 (``attention_precision``), autocast or not, and returned in bf16."""
    # fp32 inputs too under CPU autocast, which would run SDPA in bf16
    autocast = q.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    if attention_precision(q.device, q.dtype) == "fp32" and (q.dtype != torch.float32 or autocast):
        with torch.autocast("cpu", enabled=False):
            out = fused_attention(
                q.float(), k.float(), v.float(), mask, scale, dropout_p, is_causal
            )
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )


def for_attention(t: Tensor) -> Tensor:
    """``t`` in what attention computes in (``attention_precision``): a projection cast once,
    before it is split into q, k, v and heads, so that autograd casts its gradient once too."""
    return t.float() if attention_precision(t.device, t.dtype) == "fp32" else t


def attention_precision(device: torch.device, dtype: torch.dtype) -> str:
    """What attention computes in for activations of ``dtype``: fp32 on a CPU whatever the
    model's dtype, because PyTorch's CPU attention kernels are slower in bf16 than in fp32 (its
    flash backward several times over; docs/training.md), so two casts cost less than they
    save; elsewhere the activations' own dtype."""
    if device.type == "cpu":
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


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
        self.impl: AttentionImpl = "fused"
        self.weights: Tensor | None = None  # last attention weights, reference path only

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

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values: (n, S, d_model) -> 2 x (n, h, S, d)."""
        kv = for_attention(self.W_KV(memory))
        k, v = kv.split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """x: (B, T, d_model) -> (B, T, d_model).

        Self-attention: keys/values come from x; when decoding they are appended to ``cache``
        and the query attends to every position there.
        Encoder-decoder attention: keys/values are ``memory_kv`` (n, h, S, d) of n sentences
        (see ``project_kv``) and B = n*b: rows i*b .. i*b+b-1 are b target sequences of
        sentence i (the beams of beam search). They share its keys/values, so the b*T queries
        of a sentence attend together, which avoids b copies of the memory.
        """
        B, T, _ = x.shape
        qk = self.h * self.d_k
        if self.self_attention:
            q, k, v = for_attention(self.W_QKV(x)).split([qk, qk, self.h * self.d_v], dim=-1)
            q, k, v = self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, h, S, d): every position so far
        else:
            assert memory_kv is not None, "encoder-decoder attention needs the memory's k, v"
            k, v = memory_kv
            n = k.size(0)
            q = for_attention(self.W_Q(x))
            q = q.view(n, -1, self.h, self.d_k).transpose(1, 2)  # (n, h, b*T, d_k)
        dropout_p = self.dropout_p if self.training else 0.0
        if self.impl == "reference":
            if is_causal:
                mask = attention_mask(q.size(2), k.size(2), q.device, causal=True)
            out, self.weights = reference_attention(q, k, v, mask, self.scale, dropout_p)
        else:
            out = fused_attention(q, k, v, mask, self.scale, dropout_p, is_causal)
        # (B or n, h, T or b*T, d_v) -> (B, T, h*d_v): concatenate the heads
        return self.W_O(out.transpose(1, 2).reshape(B, T, self.h * self.d_v).to(x.dtype))


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
        with dropout off; the model's mode and attention path are restored after."""
        was_training = self.training
        self.eval()
        self.set_attention_impl("reference")
        try:
            self(src, tgt_in)
            return {
                "encoder self-attention": [layer.self_attn.weights[0] for layer in self.encoder],
                "decoder self-attention": [layer.self_attn.weights[0] for layer in self.decoder],
                "encoder-decoder attention": [layer.src_attn.weights[0] for layer in self.decoder],
            }
        finally:
            self.set_attention_impl("fused")
            self.train(was_training)

    def set_attention_impl(self, impl: AttentionImpl) -> None:
        """ "fused" (scaled_dot_product_attention) or "reference" (records ``.weights``)."""
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.impl = impl

    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, 1, 1, S): True for real source tokens (keys that may be attended)."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> Tensor:
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        S = src.size(1)
        mask = attention_mask(
            S, S, src.device, window=self.cfg.attention_window, keys=key_padding(self.src_mask(src))
        )
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoder: tgt_in (B, T) -> states (B, T, d_model)."""
        T, r = tgt_in.size(1), self.cfg.attention_window
        # Causal alone goes to the fused kernel as is_causal; a window needs an explicit mask.
        self_mask = (
            None if r is None else attention_mask(T, T, tgt_in.device, causal=True, window=r)
        )
        memory_mask = key_padding(src_mask)
        y = self.tgt_embed(tgt_in)
        for layer in self.decoder:
            y = layer(y, memory, self_mask, memory_mask, is_causal=self_mask is None)
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

    @torch.no_grad()
    def decode_step(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
        *,
        max_len: int | None = None,
        output: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, DecoderCache]:
        """Feed the next target token(s) tgt_in (B, n) -> logits of the last one (B, vocab).

        Earlier positions come from ``cache`` (None starts a new one, with room for
        ``max_len`` positions, default the model's), so each call costs one position.
        ``memory`` (N, S, d_model) and ``src_mask`` = ``self.src_mask(src)`` (N, 1, 1, S) are
        given once per sentence: B = N*b rows, b consecutive rows per sentence (b beams).
        The memory k/v are projected once, at the first step. Inference only: no gradients
        (the cache is written in place). ``output``: the pre-softmax projection to use instead
        of ``generator``: (B, d_model) -> (B, C) (a shortlist's rows of it).
        """
        if cache is None:
            capacity = min(max_len or self.cfg.max_len, self.cfg.max_len)
            window = self.cfg.attention_window
            cache = DecoderCache(
                layers=[LayerCache(KVCache(capacity, window)) for _ in self.decoder],
                memory_padded=key_padding(src_mask) is not None,
            )
        memory_mask = (
            src_mask if cache.memory_padded else None
        )  # the fused kernel is faster without
        n, S = tgt_in.size(1), cache.step + tgt_in.size(1)
        # One new position may see every cached one (KVCache returns only the window's).
        self_mask = (
            None
            if n == 1
            else attention_mask(n, S, tgt_in.device, causal=True, window=self.cfg.attention_window)
        )
        y = self.tgt_embed(tgt_in, start=cache.step)
        for layer, layer_cache in zip(self.decoder, cache.layers):
            y = layer(y, memory, self_mask, memory_mask, cache=layer_cache)
        cache.step = S
        project = self.generator if output is None else output
        return project(self.dec_norm(y[:, -1])), cache


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


class KVCache:
    """One decoder layer's self-attention keys and values for incremental decoding.

    ``k``/``v`` are buffers (rows, h, capacity, d) allocated once per batch: each step writes
    its positions in place (no ``torch.cat`` of a growing tensor), and a beam reordering
    gathers the ``length`` filled positions into a spare pair of buffers, which then become
    the current ones (no allocation per step). Rows beyond ``rows`` and positions beyond
    ``length`` are stale and never read. With restricted attention (``window`` = r) a single
    new query sees only the last r + 1 positions, so only those are returned.
    """

    def __init__(self, capacity: int, window: int | None = None) -> None:
        self.capacity, self.window = capacity, window
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.spare: tuple[Tensor, Tensor] | None = None
        self.rows = self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (rows, h, n, d) after the cached positions; return what the new queries
        may attend: (rows, h, length, d) views (the window's last r + 1 for a single query)."""
        rows, _, n, _ = k.shape
        if self.k is None or self.v is None:
            self.k = k.new_empty(rows, k.size(1), self.capacity, k.size(3))
            self.v = v.new_empty(rows, v.size(1), self.capacity, v.size(3))
            self.rows = rows
        if rows != self.rows:
            raise ValueError(f"cache holds {self.rows} rows, step has {rows}")
        start, end = self.length, self.length + n
        if end > self.capacity:
            raise ValueError(f"cache holds {self.capacity} positions, position {end} requested")
        self.k[:rows, :, start:end] = k
        self.v[:rows, :, start:end] = v
        self.length = end
        lo = max(0, end - 1 - self.window) if self.window is not None and n == 1 else 0
        return self.k[:rows, :, lo:end], self.v[:rows, :, lo:end]

    def select(self, index: Tensor) -> None:
        """Row i becomes old row index[i] (rows may repeat, reorder or leave)."""
        if self.k is None or self.v is None:
            return
        rows = index.numel()
        if self.spare is None or self.spare[0].size(0) < rows:
            self.spare = (
                self.k.new_empty(rows, *self.k.shape[1:]),
                self.v.new_empty(rows, *self.v.shape[1:]),
            )
        L = self.length
        for old, new in zip((self.k, self.v), self.spare):
            torch.index_select(old[: self.rows, :, :L], 0, index, out=new[:rows, :, :L])
        (self.k, self.v), self.spare = self.spare, (self.k, self.v)
        self.rows = rows


@dataclass
class LayerCache:
    """One decoder layer's cached tensors: self-attention k/v, and the memory's k/v (n, h, S, d)
    projected once per sentence at the first step."""

    self_kv: KVCache
    memory_kv: tuple[Tensor, Tensor] | None = None


@dataclass
class DecoderCache:
    """Key/value cache for incremental decoding; ``step`` = target positions already seen."""

    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0
    memory_padded: bool = True  # False: no source has padding, attention needs no mask

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep/reorder target rows (beams), and with ``sentences`` the sentences' rows too.

        ``rows`` (B',) long: target row i becomes old row rows[i] (a beam reordered within its
        sentence, the beam fanning out from 1 to k, beams of finished sentences leaving).
        ``sentences`` (n',) long: the sentences that stay, for the memory k/v; leave it None
        while the sentences stay as they are: their memory k/v then need no copy at all.
        """
        for layer in self.layers:
            layer.self_kv.select(rows)
            if sentences is not None and layer.memory_kv is not None:
                layer.memory_kv = tuple(t.index_select(0, sentences) for t in layer.memory_kv)  # type: ignore[assignment]
