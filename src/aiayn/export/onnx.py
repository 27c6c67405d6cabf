"""Export to ONNX: the encoder and one decoder step with its key/value cache as two graphs that
ONNX Runtime runs, each export checked against our own decoder before it is published.

    aiayn export --checkpoint runs/demo/averaged --to onnx --out runs/demo/onnx [--quantization int8]

The directory holds ``encoder.onnx``, ``decoder_step.onnx``, the SentencePiece model(s)
(``spm.model``, or an imported model's two and their table) and ``model.json``: the special
ids, the paper's search defaults, the graphs' inputs and outputs, the opset and the versions
of ONNX Runtime and torch, and the largest log-probability difference from ours measured at
export (``verify``). docs/export.md shows a consumer in Python with no aiayn import.

The graphs, for n sentences of S source tokens, B = n*b decoder rows (b beams a sentence),
L decoder layers, t target positions already fed:

    encoder:      src (n, S) int64 -> memory_keys (L, n, h, S, d_k), memory_values
                  (L, n, h, S, d_v), memory_bias (n, S) float (0, or -inf on padding)
    decoder_step: tokens (B, 1) int64, memory_keys, memory_values, memory_bias, past_keys
                  (L, B, h, t, d_k), past_values (L, B, h, t, d_v) -> log_probs (B, V),
                  keys (L, B, h, t+1, d_k), values (L, B, h, t+1, d_v)

The encoder-decoder keys and values are projected once per sentence and shared by its beams
(row r reads sentence r // b), as ``aiayn.decode.cache`` does; a search reorders the rows of
``keys``/``values`` between steps. Exported with torch's TorchScript exporter: it traces the
dynamic length t from the cache's shape, where the dynamo exporter needs ``onnxscript`` and a
torch.export of our model, which its data-dependent shapes make a longer road.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.pieces import copy_vocabulary
from ..decode.cache import decode_step, decoder_layers, new_cache
from ..decode.config import DecodeConfig
from ..decode.translate import eval_mode
from ..model import DecoderLayer, MultiHeadAttention, Transformer
from .common import (
    ExportError,
    check_vocab_size,
    export_dir,
    refuse_decoding_form,
    refuse_unsupported,
    require,
)

TARGET = "ONNX"
FORMAT = 1  # the directory's layout: bump when the exporter writes something else
OPSET = 17  # LayerNormalization is a single op from 17 on
ENCODER, DECODER, CONFIG = "encoder.onnx", "decoder_step.onnx", "model.json"
ENCODER_IO = (["src"], ["memory_keys", "memory_values", "memory_bias"])
DECODER_IO = (
    ["tokens", "memory_keys", "memory_values", "memory_bias", "past_keys", "past_values"],
    ["log_probs", "keys", "values"],
)
QUANTIZATIONS = ("int8",)
TOLERANCE = 1e-4  # the largest fp32 log-probability difference from ours an export may have
LIKELY = 0.01  # the tokens whose log-probabilities int8's difference is reported on


class EncoderGraph(nn.Module):
    """src (n, S) -> what every decoder step reads: each decoder layer's encoder-decoder keys
    and values, stacked over layers, and the additive mask of the padding."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        memory = self.model.encode(src)  # (n, S, d_model)
        layers = decoder_layers(self.model)
        keys, values = zip(*(layer.src_attn.project_kv(memory) for layer in layers))
        padding = src == self.model.cfg.pad_id
        bias = torch.zeros(src.shape, dtype=memory.dtype).masked_fill(padding, float("-inf"))
        return torch.stack(keys), torch.stack(values), bias


class DecoderStepGraph(nn.Module):
    """One target position of B rows against the cache (module docstring): the decoder's
    sub-layers as ``model.DecoderLayer`` orders them, attention written out over the cache."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        embed = model.tgt_embed  # positions: learned (Table 3 row E) or sinusoidal
        self.positions = (
            embed.learned.weight if hasattr(embed, "learned") else embed.get_buffer("pe")
        )

    def forward(
        self,
        tokens: Tensor,
        memory_keys: Tensor,
        memory_values: Tensor,
        memory_bias: Tensor,
        past_keys: Tensor,
        past_values: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        t = past_keys.shape[3]  # traced: the graph reads it from the input's shape
        embed = self.model.tgt_embed
        y = embed.tokens(tokens) * embed.scale + self.positions[t : t + 1]  # (B, 1, d_model)
        bias = memory_bias[:, None, None, :]  # (n, 1, 1, S)
        new_keys, new_values = [], []
        for i, layer in enumerate(decoder_layers(self.model)):
            cache = (past_keys[i], past_values[i])
            y, k, v = self._layer(layer, y, cache, (memory_keys[i], memory_values[i], bias))
            new_keys.append(k)
            new_values.append(v)
        logits = self.model.generator(self.model.dec_norm(y[:, -1]))
        return F.log_softmax(logits, dim=-1), torch.stack(new_keys), torch.stack(new_values)

    @staticmethod
    def _layer(layer: DecoderLayer, y: Tensor, past: Any, memory: Any) -> tuple[Tensor, ...]:
        """The layer's own wiring (``DecoderLayer.sublayers``) around attention over the
        cache; y (B, 1, d)."""
        kv: list[Tensor] = []

        def self_attention(x: Tensor) -> Tensor:
            out, k, v = _cached_self_attention(layer.self_attn, x, *past)
            kv.extend((k, v))
            return out

        def src_attention(x: Tensor) -> Tensor:
            return _shared_memory_attention(layer.src_attn, x, *memory)

        y = layer.sublayers(y, self_attention, src_attention)  # dropout: eval, the identity
        return y, kv[0], kv[1]


def _cached_self_attention(
    attn: MultiHeadAttention, x: Tensor, past_k: Tensor, past_v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """x (B, 1, d_model), past (B, h, t, d) -> (output (B, 1, d_model), keys and values
    (B, h, t+1, d)): the new position sees every earlier one, so no mask."""
    B, h, d_k, d_v = x.size(0), attn.h, attn.d_k, attn.d_v
    q, k, v = attn.W_QKV(x).split([h * d_k, h * d_k, h * d_v], dim=-1)
    keys = torch.cat([past_k, k.view(B, 1, h, d_k).transpose(1, 2)], dim=2)
    values = torch.cat([past_v, v.view(B, 1, h, d_v).transpose(1, 2)], dim=2)
    q = q.view(B, 1, h, d_k).transpose(1, 2)  # (B, h, 1, d_k)
    weights = torch.softmax(torch.matmul(q, keys.transpose(2, 3)) * attn.scale, dim=-1)
    out = torch.matmul(weights, values)  # (B, h, 1, d_v)
    return attn.W_O(out.transpose(1, 2).reshape(B, 1, h * d_v)), keys, values


def _shared_memory_attention(
    attn: MultiHeadAttention, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor
) -> Tensor:
    """x (n*b, 1, d_model) over keys/values (n, h, S, d) of n sentences, b rows each:
    the b queries of a sentence attend together over its keys (n, h, b, S)."""
    B, n, h, d_k, d_v = x.size(0), keys.size(0), attn.h, attn.d_k, attn.d_v
    q = attn.W_Q(x).view(n, -1, h, d_k).transpose(1, 2)  # (n, h, b, d_k)
    scores = torch.matmul(q, keys.transpose(2, 3)) * attn.scale + bias
    out = torch.matmul(torch.softmax(scores, dim=-1), values)  # (n, h, b, d_v)
    return attn.W_O(out.transpose(1, 2).reshape(B, 1, h * d_v))


def _example(model: Transformer) -> tuple[Tensor, tuple[Tensor, ...]]:
    """A padded source of 2 sentences and a step of 2 beams each after 3 positions: sizes
    that differ from each other, so that no dynamic size is traced as another's constant."""
    c = model.cfg
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, c.pad_id, c.pad_id]])  # any ids but pad
    mk, mv, bias = EncoderGraph(model)(src)
    L, h, d_k, d_v = c.N_dec, c.h, c.resolved_d_k, c.resolved_d_v
    past = (torch.zeros(L, 4, h, 3, d_k), torch.zeros(L, 4, h, 3, d_v))
    return src, (torch.full((4, 1), 11), mk, mv, bias, *past)


def _export_graphs(model: Transformer, directory: Path) -> None:
    src, step = _example(model)
    axes = {
        "src": {0: "sentences", 1: "source_length"},
        "memory_keys": {1: "sentences", 3: "source_length"},
        "memory_values": {1: "sentences", 3: "source_length"},
        "memory_bias": {0: "sentences", 1: "source_length"},
        "tokens": {0: "rows"},
        "past_keys": {1: "rows", 3: "past_length"},
        "past_values": {1: "rows", 3: "past_length"},
        "log_probs": {0: "rows"},
        "keys": {1: "rows", 3: "length"},
        "values": {1: "rows", 3: "length"},
    }
    jobs = (
        (EncoderGraph, (src,), ENCODER, ENCODER_IO),
        (DecoderStepGraph, step, DECODER, DECODER_IO),
    )
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        for graph, args, name, (inputs, outputs) in jobs:
            torch.onnx.export(  # a wrapper in eval mode: the exporter restores its mode after
                graph(model).eval(),
                args,
                str(directory / name),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={k: v for k, v in axes.items() if k in inputs + outputs},
                opset_version=OPSET,
                dynamo=False,
            )


def session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session of one graph; ``threads``: its intra-op threads (0: its
    default, one per core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def verify(
    model: Transformer, directory: Path, *, bos_id: int, eos_id: int, steps: int = 6
) -> tuple[float, float]:
    """The largest difference between the graphs' log-probabilities and ours (the decoding
    cache's step, ``aiayn.decode.cache``) over ``steps`` steps of 2 rows for each of 3
    sentences of different lengths, padded: every row a different prefix (each sentence's
    best and second best next token by our model), over every token and over the likely ones
    (probability >= ``LIKELY`` by ours: int8's error is largest on the unlikely). -inf
    must be -inf in both."""
    c = model.cfg
    lengths, b, V = (7, 4, 2), 2, c.vocab_size
    src = torch.full((len(lengths), max(lengths)), c.pad_id)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.arange(n) * 7 % (V - 4) + 4
        src[i, n - 1] = eos_id
    encoder, step = session(directory / ENCODER), session(directory / DECODER)
    mk, mv, bias = encoder.run(None, {"src": src.numpy()})
    L, B = c.N_dec, len(lengths) * b
    past = [torch.zeros(L, B, c.h, 0, d).numpy() for d in (c.resolved_d_k, c.resolved_d_v)]
    with torch.no_grad():
        cache = new_cache(model, model.encode(src), model.src_mask(src))
    tokens, worst, likely = torch.full((B, 1), bos_id), 0.0, 0.0
    for _ in range(steps):
        with torch.no_grad():
            ours = F.log_softmax(decode_step(model, tokens, cache).float(), dim=-1)
        feed = {"tokens": tokens.numpy(), "memory_keys": mk, "memory_values": mv}
        feed.update(memory_bias=bias, past_keys=past[0], past_values=past[1])
        theirs, *past = step.run(None, feed)
        theirs = torch.from_numpy(theirs)
        finite = torch.isfinite(ours)
        if not torch.equal(finite, torch.isfinite(theirs)):
            raise RuntimeError(f"{directory / DECODER}: -inf where ours is finite, or back")
        apart = (ours - theirs).abs()
        worst = max(worst, float(apart[finite].max()))
        likely = max(likely, float(apart[ours >= math.log(LIKELY)].max()))
        best = ours.topk(2, dim=-1).indices  # (B, 2): row j of a sentence takes its j-th best
        tokens = best.gather(1, (torch.arange(B) % b)[:, None])
    return worst, likely


def quantize_int8(directory: Path) -> None:
    """Both graphs' weights as int8 in place: ONNX Runtime's dynamic quantization (weights
    int8 per tensor, activations quantized per call), of MatMul and Gather (the embeddings)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process is for convolution networks
    try:
        for name in (ENCODER, DECODER):
            fp32 = directory / f"fp32-{name}"
            (directory / name).rename(fp32)
            quantize_dynamic(fp32, directory / name, weight_type=QuantType.QInt8)
            fp32.unlink()
    finally:
        root.setLevel(level)


def consumer_config(model: Transformer, vocab: Any, quantization: str | None) -> dict[str, Any]:
    """``model.json``: what a program that runs the graphs needs, and what they were made with."""
    import onnxruntime

    c, search = model.cfg, DecodeConfig.preset("translation")
    return {
        "format": FORMAT,
        "opset": OPSET,
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "quantization": quantization,
        "graphs": {"encoder": ENCODER, "decoder_step": DECODER},
        "inputs": {"encoder": ENCODER_IO[0], "decoder_step": DECODER_IO[0]},
        "outputs": {"encoder": ENCODER_IO[1], "decoder_step": DECODER_IO[1]},
        "ids": {"pad": c.pad_id, "bos": vocab.bos_id, "eos": vocab.eos_id, "unk": vocab.unk_id},
        "vocab_size": c.vocab_size,
        "max_len": c.max_len,
        "layers": c.N_dec,
        "heads": c.h,
        "d_k": c.resolved_d_k,
        "d_v": c.resolved_d_v,
        "vocabulary": None,  # spm.model, or pieces.json naming two (``data.pieces``)
        "search": {
            "beam": search.beam,
            "alpha": search.alpha,
            "max_len_a": search.max_len_a,
            "max_len_b": search.max_len_b,
            "length_penalty": "((5 + |Y|) / 6) ** alpha",
        },
    }


def export_onnx(
    model: Transformer,
    vocab: Any,
    out: str | os.PathLike,
    quantization: str | None = None,
    source: str | None = None,
    *,
    fingerprint: str | None = None,
) -> Path:
    """Write the ONNX directory (module docstring) of ``model``; its graphs' log-probabilities
    are checked against ours before it is published (``verify``: within ``TOLERANCE`` in
    fp32, a bug otherwise; int8's difference is recorded). ``quantization``: None or "int8".
    ``fingerprint``: the source checkpoint's, in the marker (``onnx_engine``'s cache)."""
    require("onnx", TARGET, extra="onnx")
    require("onnxruntime", TARGET, extra="onnx")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"quantization {quantization!r} for ONNX: choose {', '.join(QUANTIZATIONS)}"
        )
    c = model.cfg
    supported = {"norm", "positional", "scale_attention", "activation", "output_bias", "d_k"}
    refuse_unsupported(c, TARGET, supported)  # not the restricted attention of Table 1
    refuse_decoding_form(model)
    check_vocab_size(c, vocab)
    config = consumer_config(model, vocab, quantization)
    info = {"format": "onnx", "quantization": quantization, "source": source}
    if fingerprint is not None:
        info["fingerprint"] = fingerprint
    with export_dir(out, info) as tmp, eval_mode(model):  # no dropout in the graphs
        _export_graphs(model, tmp)
        ids = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id}
        difference = verify(model, tmp, **ids)
        if difference[0] > TOLERANCE:  # a graph that is not our model: a bug of this exporter
            raise RuntimeError(f"ONNX export: log-probabilities {difference[0]:.2e} from ours")
        if quantization == "int8":
            quantize_int8(tmp)
            difference = verify(model, tmp, **ids)
        config["max_log_prob_difference"] = difference[0]
        config[f"max_log_prob_difference_p{LIKELY}"] = difference[1]
        if vocab.path is not None:  # a vocabulary without a file: made-up pieces (benchmarks)
            config["vocabulary"] = copy_vocabulary(vocab.path, tmp).name
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return Path(out)
