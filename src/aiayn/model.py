"""The Transformer, in the order of section 3 of "Attention Is All You Need": the encoder
and decoder stacks (3.1), attention (3.2), the feed-forward networks (3.3), embeddings and
positional encoding (3.4, 3.5), then the model (Figure 1) with a reference
incremental step (``aiayn.decode.cache`` holds the fast one the searches use).

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
from dataclasses import dataclass

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
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.P_drop)  # 5.4: residual dropout
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
    """Masked self-attention, encoder-decoder attention, feed-forward (Figure 1, right); the
    fast decode step (``aiayn.decode.cache.step_layer``) runs the same ``sublayers``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.src_attn = MultiHeadAttention(cfg, self_attention=False)
        self.src_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.P_drop)  # 5.4: residual dropout
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

        return self.sublayers(y, self_attention, src_attention)

    def sublayers(
        self,
        y: Tensor,
        self_attention: Callable[[Tensor], Tensor],
        src_attention: Callable[[Tensor], Tensor],
    ) -> Tensor:
        """The layer's wiring around its two attentions, given as functions of the (normed)
        input, y (B, T, d_model) -> (B, T, d_model): residuals, norms, dropout and the
        feed-forward network. ``forward`` gives attention over the whole sequence; a decode
        step (``aiayn.decode.cache``) gives attention over its cache, so that both run one
        wiring."""
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


def as_given(t: Tensor) -> Tensor:
    """The default cast and key padding of ``Kernels``: the tensor as it is."""
    return t


@dataclass
class Kernels:
    """What a faster implementation may replace, declared in one place; each computes what its
    default does (``aiayn.runtime.kernels`` has the faster ones; ``Transformer.use_kernels``).

    ``attention_cast``: what attention's projections are cast to, once, before the heads;
    ``attention``: attention with ``F.scaled_dot_product_attention``'s arguments (the function
    ``reference_attention`` writes out); ``key_padding``: the key-padding mask (B, 1, 1, S), or
    None where no key is padding; ``dropout``: the class of every ``nn.Dropout`` (5.4);
    ``decode_attention``: what a decode step's attention computes in, "fp32" or "bf16" (read
    by ``aiayn.decode.cache``; None: what the encoder's does).
    """

    attention_cast: Callable[[Tensor], Tensor] = as_given
    attention: Callable[..., Tensor] = F.scaled_dot_product_attention
    key_padding: Callable[[Tensor], Tensor | None] = as_given
    dropout: type[nn.Dropout] = nn.Dropout
    decode_attention: str | None = None


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
        self.kernels = Kernels()  # the attention cast and kernel; the model's (use_kernels)

    def reset_parameters(self, init: Init) -> None:
        """W_O: Xavier-uniform, bias 0. W_Q, W_K, W_V: "xavier" treats a stacked matrix (W_QKV,
        W_KV) as one; "fairseq" draws each of W_Q, W_K, W_V as its own Xavier-uniform matrix with
        gain 1/sqrt(2) (on W_QKV that equals Xavier on the stack) and gives them PyTorch's default
        biases, U(+-1/sqrt(d_model)), instead of 0."""
        qk, v = self.h * self.d_k, self.h * self.d_v
        if self.self_attention:
            stacks = [(self.W_QKV, [qk, qk, v])]
        else:
            stacks = [(self.W_Q, [qk]), (self.W_KV, [qk, v])]
        for linear, sizes in stacks:
            if init == "xavier":
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)
                continue
            with torch.no_grad():
                for block in linear.weight.split(sizes, dim=0):  # W_Q / W_K / W_V rows: views
                    nn.init.xavier_uniform_(block, gain=2**-0.5)
            bound = linear.in_features**-0.5
            nn.init.uniform_(linear.bias, -bound, bound)
        nn.init.xavier_uniform_(self.W_O.weight)
        nn.init.zeros_(self.W_O.bias)

    def heads(self, x: Tensor, d: int) -> Tensor:
        """The h heads of a projection, side by side in its last dimension, as a dimension of
        their own: (B, L, h*d) -> (B, h, L, d), a view."""
        B, L, _ = x.shape
        return x.view(B, L, self.h, d).transpose(1, 2)  # (B, L, h*d) -> (B, h, L, d)

    def project_kv(self, memory: Tensor, cast: bool = True) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values: (n, S, d_model) -> 2 x (n, h, S, d), views; in what
        attention computes in (``attention_cast``), or with ``cast`` False in the projection's
        dtype, for a caller that casts them as it lays them out (``decode.cache``: one copy)."""
        kv = self.W_KV(memory)
        kv = self.kernels.attention_cast(kv) if cast else kv
        k, v = kv.split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self.heads(k, self.d_k), self.heads(v, self.d_v)

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
            q, k, v = self.kernels.attention_cast(self.W_QKV(x)).split(
                [qk, qk, self.h * self.d_v], dim=-1
            )
            q, k, v = self.heads(q, self.d_k), self.heads(k, self.d_k), self.heads(v, self.d_v)
        else:
            assert memory_kv is not None, "encoder-decoder attention needs the memory's k, v"
            k, v = memory_kv
            q = self.heads(self.kernels.attention_cast(self.W_Q(x)), self.d_k)
        dropout_p = self.dropout_p if self.training else 0.0
        if weights is not None:
            if is_causal:
                mask = attention_mask(T, k.size(2), q.device, causal=True)
            out, w = reference_attention(q, k, v, mask, self.scale, dropout_p)
            weights.append(w)
        else:
            kernel = self.kernels.attention  # is_causal: the decoder's mask without building it
            out = kernel(q, k, v, mask, dropout_p, is_causal=is_causal, scale=self.scale)
        return self.concat_heads(out, x)  # (B, h, T, d_v) -> W_O of the concatenated heads

    def concat_heads(self, out: Tensor, x: Tensor) -> Tensor:
        """Concat(head_1, ..., head_h) W_O: heads (B, h, T, d_v) of x (B, T, d_model), or
        (n, h, b*m, d_v) of the rows of x (n*b, m, d_model) in a decode step
        (``aiayn.decode.cache``) -> (B, T, d_model); a cast back to x's dtype lays the heads
        side by side in the same copy (else the reshape would copy too)."""
        B, T, _ = x.shape
        amp = torch.amp.is_autocast_available(t := x.device.type) and torch.is_autocast_enabled(t)
        dtype = torch.get_autocast_dtype(t) if amp else x.dtype  # W_O's: no round trip via fp32
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
    ``keys`` (B, 1, 1, S): key padding (``Transformer.src_mask``), combined with the above.
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


# --- 3.3 Position-wise feed-forward networks --------------------------------------------


# ``activation`` other than "relu" is a deviation (pretrained OPUS-MT models use swish).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "swish": F.silu,
    "gelu": F.gelu,
}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, inner size d_ff (max(0, .) is ``cfg.activation``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.W_1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.W_2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]

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
        return self.W_2(self.activation(self.W_1(x)))


# --- 3.4 Embeddings and softmax, 3.5 Positional encoding ---------------------------------


# fairseq's first position is padding_idx + 1 = 2 (its make_positions); the others count from 0
SINUSOID_START = {"sinusoidal": 0, "marian": 0, "fairseq": 2}


def sinusoidal_encoding(max_len: int, d_model: int, marian: bool = False, start: int = 0) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...): (max_len, d_model).
    ``marian``: 10000^(2i/(d_model - 2)), the timescales Marian's own models were trained with;
    ``start``: the first row's pos (fairseq's models count positions from 2)."""
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d_model, 2).double() / (d_model - 2 * marian))
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
            marian, start = cfg.positional in ("marian", "fairseq"), SINUSOID_START[cfg.positional]
            pe = sinusoidal_encoding(cfg.max_len, cfg.d_model, marian, start)
            self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(cfg.P_drop)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x: (B, L) token ids at positions start..start+L-1 -> (B, L, d_model)."""
        end = start + x.size(1)
        if end > self.max_len:
            raise ValueError(f"sequence of length {end} exceeds max_len={self.max_len}")
        table = self.learned.weight if hasattr(self, "learned") else self.get_buffer("pe")
        pe = table[start:end]
        return self.dropout(self.tokens(x) * self.scale + pe)


# --- The model -----------------------------------------------------------------------------


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Figure 1). ``forward`` is teacher-forced training;
    ``encode`` + ``new_cache`` + ``decode_step`` the decoding interface, a reference step here."""

    def __init__(self, cfg: ModelConfig, init: Init = "fairseq") -> None:
        super().__init__()
        self.cfg = cfg
        # 3.4: one matrix for both embeddings and the pre-softmax projection (shared vocabulary)
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tgt_tokens = src_tokens
        if not cfg.share_embeddings:
            tgt_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.src_embed = Embedding(cfg, src_tokens)
        self.tgt_embed = Embedding(cfg, tgt_tokens)
        self.encoder = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.N_enc)])
        self.decoder = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.N_dec)])
        pre = cfg.norm == "pre"  # pre-LN needs a final LayerNorm on each stack; post-LN has none
        self.enc_norm = nn.LayerNorm(cfg.d_model, cfg.norm_eps) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model, cfg.norm_eps) if pre else nn.Identity()
        # ``output_bias``: a bias on the pre-softmax layer, as Marian's (imported models) have.
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.output_bias)
        self.generator.weight = tgt_tokens.weight  # tied: the same Parameter object
        self.kernels = Kernels()  # what may be swapped for a faster kernel (use_kernels)
        self.reset_parameters(init)

    def use_kernels(self, kernels: Kernels) -> Transformer:
        """The model computing with ``kernels`` (``Kernels``), in place: every attention takes
        them, and every dropout becomes ``kernels.dropout`` with its rate and mode. The weights,
        and so the state dict, are untouched."""
        self.kernels = kernels
        for module in list(self.modules()):
            if isinstance(module, MultiHeadAttention):
                module.kernels = kernels
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Dropout) and type(child) is not kernels.dropout:
                    dropout = kernels.dropout(child.p, inplace=child.inplace)
                    setattr(module, name, dropout.train(child.training))
        return self

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
        if self.generator.bias is not None:
            nn.init.zeros_(self.generator.bias)
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
        S, keys = src.size(1), self.kernels.key_padding(self.src_mask(src))
        mask = attention_mask(S, S, src.device, window=self.cfg.attention_window, keys=keys)
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
        T, r, device = tgt_in.size(1), self.cfg.attention_window, tgt_in.device
        # Causal alone goes to the fused kernel as is_causal; a window needs an explicit mask.
        self_mask = None if r is None else attention_mask(T, T, device, causal=True, window=r)
        memory_mask = self.kernels.key_padding(src_mask)
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

    # A reference incremental step: the prefix decoded again (``aiayn.decode.cache``: fast).

    def new_cache(self, memory: Tensor, src_mask: Tensor, max_len: int | None = None) -> Prefixes:
        """The reference step's cache for ``memory`` (n, S, d_model), ``src_mask`` (n, 1, 1, S)."""
        return Prefixes(memory, src_mask, memory.new_zeros(memory.size(0), 0, dtype=torch.long))

    @torch.no_grad()
    def decode_step(self, tgt_in: Tensor, cache: Prefixes) -> Tensor:
        """Feed the next target token(s) tgt_in (n*b, m) -> logits of the last one (n*b, vocab)."""
        past = cache.tokens if cache.tokens.size(1) else tgt_in[:, :0]  # none yet: any rows
        cache.tokens = torch.cat([past, tgt_in], dim=1)  # (n*b, t)
        b = cache.tokens.size(0) // cache.memory.size(0)  # rows (beams) per sentence
        memory, mask = (t.repeat_interleave(b, dim=0) for t in (cache.memory, cache.src_mask))
        return self.generator(self.decode(cache.tokens, memory, mask)[:, -1])


@dataclass
class Prefixes:
    """The reference step's cache: n sentences' memory (n, S, d_model) and source mask, and the
    tokens fed so far (n*b, t), rows sentence-major (b beams per sentence)."""

    memory: Tensor
    src_mask: Tensor
    tokens: Tensor

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep/reorder the rows (n'*b,), and with ``sentences`` (n',) the sentences."""
        self.tokens = self.tokens[rows]
        if sentences is not None:
            self.memory, self.src_mask = self.memory[sentences], self.src_mask[sentences]
