"""Export to CTranslate2, built with its converter API (``ctranslate2.specs``) from our weights.

CTranslate2's ``TransformerSpec`` is the layout of OpenNMT's Transformer, which is ours: a fused
Q/K/V projection for self-attention, a fused K/V projection for encoder-decoder attention,
post-LN (or pre-LN with a final norm on each stack), scaled embeddings and a tied output layer.
The positional table is stored explicitly, so ours (or the learned one of Table 3 row E) is
used as it is. The SentencePiece model is copied beside ``model.bin`` as ``spm.model``; sources
are given as pieces and CTranslate2 appends eos itself, as our data pipeline does.

    import ctranslate2, sentencepiece as spm
    sp, tr = spm.SentencePieceProcessor(model_file=f"{OUT}/spm.model"), ctranslate2.Translator(OUT)
    print(sp.decode(tr.translate_batch([sp.encode("In the beginning", out_type=str)])[0].hypotheses[0]))

CTranslate2 ranks finished hypotheses by ``log P / |Y|^alpha``, not by the paper's GNMT
penalty: ``export.ct2_search`` runs the paper's search on such an export (``--engine
ctranslate2``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.pieces import copy_vocabulary
from ..model import Embedding, Transformer
from .common import (
    ExportError,
    check_vocab_size,
    export_dir,
    layers,
    refuse_decoding_form,
    refuse_unsupported,
    require,
)

TARGET = "CTranslate2"


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _linear(spec: Any, linear: torch.nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    spec.bias = _array(linear.bias)


def _norm(spec: Any, norm: torch.nn.Module) -> None:
    assert isinstance(norm, torch.nn.LayerNorm)  # the model's pre-norm slots hold one then
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _positions(embed: Embedding) -> np.ndarray:
    """The (max_len, d_model) table an ``Embedding`` adds: learned (Table 3 row E) or sinusoidal."""
    return _array(embed.learned.weight if hasattr(embed, "learned") else embed.get_buffer("pe"))


def ctranslate2_spec(model: Transformer, vocab: Any) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding our weights and vocabulary."""
    require("ctranslate2", TARGET)
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.cfg
    refuse_unsupported(
        c, TARGET, supported={"norm", "positional", "activation", "output_bias", "norm_eps"}
    )
    refuse_decoding_form(model)
    check_vocab_size(c, vocab)
    spec = transformer_spec.TransformerSpec.from_config(
        (c.N_enc, c.N_dec),
        c.h,
        pre_norm=c.norm == "pre",
        activation=getattr(common_spec.Activation, c.activation.upper()),
    )
    encoder, decoder = layers(model)
    spec.config.layer_norm_epsilon = encoder[0].self_attn_norm.eps
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = vocab.id_to_piece(vocab.bos_id)
    for name, i in (
        ("unk_token", vocab.unk_id),
        ("bos_token", vocab.bos_id),
        ("eos_token", vocab.eos_id),
    ):
        setattr(spec.config, name, vocab.id_to_piece(i))
    enc, dec = spec.encoder, spec.decoder
    enc.position_encodings.encodings = _positions(model.src_embed)
    dec.position_encodings.encodings = _positions(model.tgt_embed)
    enc.embeddings[0].weight = _array(model.src_embed.tokens.weight)
    dec.embeddings.weight = _array(model.tgt_embed.tokens.weight)
    dec.projection.weight = _array(model.generator.weight)  # tied: CTranslate2 aliases equal arrays
    if c.output_bias:
        dec.projection.bias = _array(model.generator.bias)
    if c.norm == "pre":
        _norm(enc.layer_norm, model.enc_norm)
        _norm(dec.layer_norm, model.dec_norm)
    for ours, theirs in zip(encoder, enc.layer):
        _linear(theirs.self_attention.linear[0], ours.self_attn.W_QKV)
        _linear(theirs.self_attention.linear[1], ours.self_attn.W_O)
        _norm(theirs.self_attention.layer_norm, ours.self_attn_norm)
        _linear(theirs.ffn.linear_0, ours.feed_forward.W_1)
        _linear(theirs.ffn.linear_1, ours.feed_forward.W_2)
        _norm(theirs.ffn.layer_norm, ours.ffn_norm)
    for dours, theirs in zip(decoder, dec.layer):
        _linear(theirs.self_attention.linear[0], dours.self_attn.W_QKV)
        _linear(theirs.self_attention.linear[1], dours.self_attn.W_O)
        _norm(theirs.self_attention.layer_norm, dours.self_attn_norm)
        _linear(theirs.attention.linear[0], dours.src_attn.W_Q)
        _linear(theirs.attention.linear[1], dours.src_attn.W_KV)
        _linear(theirs.attention.linear[2], dours.src_attn.W_O)
        _norm(theirs.attention.layer_norm, dours.src_attn_norm)
        _linear(theirs.ffn.linear_0, dours.feed_forward.W_1)
        _linear(theirs.ffn.linear_1, dours.feed_forward.W_2)
        _norm(theirs.ffn.layer_norm, dours.ffn_norm)
    pieces = [vocab.id_to_piece(i) for i in range(len(vocab))]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def export_ctranslate2(
    model: Transformer,
    vocab: Any,
    out: str | os.PathLike,
    quantization: str | None = None,
    source: str | None = None,
    *,
    fingerprint: str | None = None,
) -> Path:
    """Write a CTranslate2 model directory (``model.bin``, vocabulary, and ``spm.model``, or
    ``source.spm`` and ``target.spm`` with their table, when ``vocab.path`` names one).

    ``quantization``: CTranslate2's weight type, e.g. "int8" (None keeps float32).
    ``fingerprint``: the source checkpoint's, recorded in the marker (``export.engine``'s cache).
    """
    require("ctranslate2", TARGET)
    # the spec's own validate / optimize / save, the steps of ctranslate2's Converter.convert:
    # importing ctranslate2.converters imports every converter, transformers among them
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise ExportError(
            f"quantization {quantization!r} is not one of CTranslate2's: {', '.join(ACCEPTED_MODEL_TYPES)}"
        )
    spec = ctranslate2_spec(model, vocab)  # validated
    info = {"format": "ctranslate2", "quantization": quantization, "source": source}
    if fingerprint is not None:
        info["fingerprint"] = fingerprint
    with export_dir(out, info) as tmp:
        spec.optimize(quantization=quantization)
        spec.save(str(tmp))
        if vocab.path is not None:  # a vocabulary without a file: made-up pieces (benchmarks)
            copy_vocabulary(vocab.path, tmp)  # spm.model, or the two models and their table
    return Path(out)
