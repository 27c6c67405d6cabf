"""Incremental decoding's fast path (section 6's search): the key/value cache where a search's
beams share their history, and the decoder step that reads and writes it.

The searches call ``new_cache(model, memory, src_mask, max_len)`` once per batch of sentences,
then ``decode_step(model, tgt_in, cache)`` once per output position. For a ``Transformer`` these
are the shared-history cache below (``DecoderCache``) and the step of its decoder layers against
it (``step_layer``: the layer's own sub-layers, with attention over the cached keys and values);
any other model (a scripted fake, an ``Ensemble``) answers through its own ``new_cache`` /
``decode_step``. The model's ``Transformer.decode_step`` is the reference this one reproduces:
the cache depends on the model, never the reverse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from ..model import DecoderLayer, MultiHeadAttention, Transformer, attention_mask
from ..runtime.kernels import attention_precision, key_padding

# --- The decoding interface ----------------------------------------------------------------


def decoder_layers(model: Transformer) -> Iterable[DecoderLayer]:
    """The decoder's layers as what they are (an ``nn.ModuleList`` yields plain ``Module``s);
    the list itself, no copy, since the decoder steps through it every token."""
    return cast("Iterable[DecoderLayer]", model.decoder)


def new_cache(model: Any, memory: Any, src_mask: Tensor, max_len: int | None = None) -> Any:
    """What a search starts from: for a ``Transformer`` the shared-history cache
    (``shared_history_cache``), for any other model (a fake, an ensemble) its own
    ``new_cache``."""
    if not isinstance(model, Transformer):
        return model.new_cache(memory, src_mask, max_len=max_len)
    return shared_history_cache(model, memory, src_mask, max_len=max_len)


@torch.no_grad()
def shared_history_cache(
    model: Transformer, memory: Tensor, src_mask: Tensor, max_len: int | None = None
) -> DecoderCache:
    """The cache that decoding ``memory`` (n, S, d_model) starts from, ``src_mask`` =
    ``model.src_mask(src)`` (n, 1, 1, S): each layer's encoder-decoder keys and values,
    projected once per sentence and shared by its beams, and room for ``max_len`` target
    positions (default, and at most, the model's); keys and values in what the decoder's
    attention computes in (``Kernels.decode_attention``)."""
    capacity = min(max_len or model.cfg.max_len, model.cfg.max_len)
    # a bf16 model may decode with its own (``runtime.precision.to_bf16``)
    precision = model.kernels.decode_attention or attention_precision(memory.device, memory.dtype)
    dtype = torch.float32 if precision == "fp32" else memory.dtype
    padding = key_padding(src_mask)
    bias = None
    if padding is not None:  # (n, h, 1, S): -inf on the padding, per head
        bias = torch.zeros(padding.shape, dtype=dtype, device=memory.device)
        bias = bias.masked_fill_(~padding, float("-inf")).expand(-1, model.cfg.h, -1, -1)
        bias = bias.contiguous()
    layers, contiguous = [], torch.contiguous_format
    for layer in decoder_layers(model):
        k, v = layer.src_attn.project_kv(memory, cast=False)  # 2 x (n, h, S, d)
        # cast and laid out in one copy each (``copy``: also when the dtype is already it);
        # the keys stored (n, h, d, S), seen as (n, h, S, d)
        keys = k.transpose(2, 3).to(dtype, memory_format=contiguous, copy=True)
        values = v.to(dtype, memory_format=contiguous, copy=True)
        layers.append(LayerCache(keys.transpose(2, 3), values))
    return DecoderCache(layers, bias, capacity, model.cfg.attention_window)


@torch.no_grad()
def decode_state(model: Transformer, tgt_in: Tensor, cache: DecoderCache) -> Tensor:
    """Feed the next target token(s) tgt_in (n*b, m) -> the decoder's output for the last of
    them (n*b, d_model), before the output projection; earlier positions come from
    ``cache``, which takes the new ones (so each call costs its new positions only). Rows
    are sentence-major: b consecutive rows (beams) per sentence of the cache."""
    step = cache.advance(tgt_in)
    y = model.tgt_embed(tgt_in, start=step.start)
    for layer, layer_cache in zip(decoder_layers(model), cache.layers):
        y = step_layer(layer, y, layer_cache, step)
    return model.dec_norm(y[:, -1])


@torch.no_grad()
def decode_step(model: Any, tgt_in: Tensor, cache: Any) -> Tensor:
    """Feed the next target token(s) tgt_in (n*b, m) -> logits of the last one (n*b, vocab)
    (see ``decode_state``). Inference only: no gradients, the cache is written in place.
    Any other model (a fake, an ensemble) answers through its own ``decode_step``."""
    if not isinstance(model, Transformer):
        return model.decode_step(tgt_in, cache)
    return model.generator(decode_state(model, tgt_in, cache))


# --- The decoder's step against the cache -----------------------------------------------


def step_layer(layer: DecoderLayer, y: Tensor, cache: LayerCache, step: Step) -> Tensor:
    """y: (n*b, m, d_model), the m new positions of every row -> (n*b, m, d_model)."""
    return layer.sublayers(
        y,
        lambda y: step_self(layer.self_attn, y, cache, step),
        lambda y: step_src(layer.src_attn, y, cache, step),
    )


def step_self(attn: MultiHeadAttention, x: Tensor, cache: LayerCache, step: Step) -> Tensor:
    """Self-attention of the m new positions of n*b rows, x: (n*b, m, d_model) ->
    (n*b, m, d_model). Their keys and values are written into the cache's slots (see
    ``DecoderCache``); each sentence's b*m queries then attend together over every slot of
    its history, ``step.self_bias`` hiding the slots that are not the query's own prefix."""
    n, b, m = step.sentences, step.beams, x.size(1)
    h, d_k, d_v = attn.h, attn.d_k, attn.d_v
    q, k, v = attn.W_QKV(x).split([h * d_k, h * d_k, h * d_v], dim=-1)  # (B, m, h*d) each
    t = step.start
    # (n*b, m, h*d) -> (n, h, m, b, d): position t+j of beam s at slot [.., t + j, s]
    cache.write(
        k.view(n, b, m, h, d_k).permute(0, 3, 2, 1, 4),
        v.view(n, b, m, h, d_v).permute(0, 3, 2, 1, 4),
        t,
    )
    keys, values = cache.history(step.first, t + m)  # (n*h, P*W, d), views
    q = _query_heads(q.view(n, b * m, h, d_k), keys.dtype)  # (n, h, b*m, d_k)
    out = cached_attention(q, keys.transpose(1, 2), values, step.self_bias, attn.scale)
    return attn.concat_heads(out, x)


def step_src(attn: MultiHeadAttention, x: Tensor, cache: LayerCache, step: Step) -> Tensor:
    """Encoder-decoder attention of n*b rows, x: (n*b, m, d_model) -> (n*b, m, d_model):
    the b*m queries of a sentence attend together over its memory's keys and values,
    projected once (``new_cache``) and shared by its beams."""
    n, (B, m, _) = step.sentences, x.shape
    keys_t, values = cache.memory()  # (n*h, d_k, S), (n*h, S, d_v)
    q = _query_heads(attn.W_Q(x).view(n, B // n * m, attn.h, attn.d_k), keys_t.dtype)
    out = cached_attention(q, keys_t, values, step.memory_bias, attn.scale)
    return attn.concat_heads(out, x)


def _query_heads(q: Tensor, dtype: torch.dtype) -> Tensor:
    """(n, b*m, h, d_k) -> (n, h, b*m, d_k) in the cache's dtype: the batched product needs
    the heads laid out as its batch, and a cast lays them out so in the same copy (without
    a cast it is a view, and the product's reshape makes that copy)."""
    return q.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)


def cached_attention(
    q: Tensor, keys_t: Tensor, values: Tensor, bias: Tensor, scale: float
) -> Tensor:
    """softmax(Q K^T * scale + bias) V for the few new queries of a decode step, as two batched
    matrix products: for one query a fused attention kernel costs several times its arithmetic.

    q: (n, h, Q, d_k), keys_t = K^T: (n*h, d_k, K), values: (n*h, K, d_v) -> (n, h, Q, d_v),
    the keys and values as views of the cache laid out for the products (``LayerCache``);
    bias: (n*h, Q, K) or broadcastable to it, 0 where a query may attend and -inf elsewhere.
    """
    n, h, Q, d_k = q.shape
    scores = torch.baddbmm(bias, q.reshape(n * h, Q, d_k), keys_t, alpha=scale)  # (n*h, Q, K)
    return torch.bmm(torch.softmax(scores, dim=-1), values).view(n, h, Q, -1)


# --- The cache ------------------------------------------------------------------------------


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
    operands: tuple[Tensor, Tensor] | None = None  # ``memory``'s views, until sentences leave

    def memory(self) -> tuple[Tensor, Tensor]:
        """The memory's keys and values as the step's products read them, (n*h, d_k, S) (K^T,
        contiguous) and (n*h, S, d_v): views made once, not every step, since they change
        only when sentences leave (``keep``)."""
        if self.operands is None:
            keys_t = self.memory_keys.flatten(0, 1).transpose(1, 2)
            self.operands = (keys_t, self.memory_values.flatten(0, 1))
        return self.operands

    def history(self, first: int, end: int) -> tuple[Tensor, Tensor]:
        """The self-attention's keys and values of positions first..end-1, every slot, as
        (n*h, P*W, d) views of the slots (one view each: n with h, positions with slots)."""
        n, h, _, W, d = self.keys.shape
        keys = self.keys[:, :, first:end].view(n * h, (end - first) * W, d)
        return keys, self.values[:, :, first:end].view(n * h, (end - first) * W, -1)

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
        self.operands = None  # the memory's views are of the tensors replaced here
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
        self.made: dict[tuple[int, ...], Tensor] = {}  # ``_index``'s tensors, by shape

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
        own = self._index(B, b, m)  # (B, m): each row's beam
        past = self.ancestry if self.ancestry is not None else own[:, :0]
        self.ancestry = torch.cat([past, own], dim=1)  # (B, end)
        self.step = end
        first = max(0, end - 1 - self.window) if self.window is not None and m == 1 else 0
        padded = self.memory_bias
        memory_bias = self.no_bias if padded is None else padded.flatten(0, 1)  # (n*h, 1, S)
        return Step(n, b, start, first, self._self_bias(m, first), memory_bias)

    def _index(self, *shape: int) -> Tensor:
        """(W,): 0..W-1, or (B, b, m) -> (B, m): each of B rows' beam (row % b), made once a
        shape and kept: a step's bookkeeping in fewer operators. Read only, never written."""
        if shape not in self.made:
            device = self.layers[0].memory_keys.device
            index = torch.arange(shape[0], device=device)
            if len(shape) == 3:
                index = (index % shape[1])[:, None].expand(shape[0], shape[2])
            self.made[shape] = index
        return self.made[shape]

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
        slots = self._index(W)
        visible = self.ancestry[:, None, first:end, None] == slots  # (B, 1, P, W)
        if m > 1:  # several new positions: causal (and windowed) among themselves
            order = attention_mask(m, end, keys.device, causal=True, window=self.window)
            assert order is not None  # causal: always a mask
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
