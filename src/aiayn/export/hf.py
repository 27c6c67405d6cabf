"""Export to Hugging Face ``transformers`` as a MarianMT model, numerically equal to ours.

MarianMT is the paper's post-LN Transformer with sinusoidal positions, scaled embeddings and a
tied output layer, so every weight has a place, with one wrinkle: Marian lays out its
positional table with all sines first and all cosines after ([sin f_0 .. sin f_{d/2-1},
cos f_0 ..]), where section 3.5 interleaves them (ours: sin f_0, cos f_0, sin f_1, ...), and
Marian recomputes that table when it loads (it is not saved). The exact route is to permute
the model dimension: with ``P = [0, 2, 4, ..., 1, 3, 5, ...]``, Marian's table is ours with
columns ``P``; permuting every d_model-sized axis by ``P`` (embedding columns, the inputs of
projections that read the residual stream, the outputs and biases of those that write it,
LayerNorm gains and biases) gives a model whose residual stream is ours permuted, and so the
same logits: attention and feed-forward read the stream through matrices permuted alike, and
LayerNorm's mean and variance do not depend on the order of the features.

Special ids stay ours (pad 0, unk 1, bos 2, eos 3); the decoder starts from bos (Marian's own
models start from pad). The tokenizer is ``MarianTokenizer`` over our SentencePiece model: it
appends eos to a source, as our data pipeline does.

    from transformers import AutoTokenizer, MarianMTModel
    tok, model = AutoTokenizer.from_pretrained(OUT), MarianMTModel.from_pretrained(OUT)
    print(tok.batch_decode(model.generate(**tok(["In the beginning"], return_tensors="pt")),
                           skip_special_tokens=True))

``activation`` and ``output_bias`` (``final_logits_bias``) map to Marian's own; options Marian
cannot represent (pre-LN, learned positions, no attention scaling, restricted
attention, d_k != d_model / h) are refused with ExportError.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.moses_bpe import MosesBpeVocab
from ..data.vocab import BOS_ID, EOS_ID, PAD_ID
from ..decode import DecodeConfig
from ..model import Transformer
from .common import (
    ExportError,
    check_vocab_size,
    export_dir,
    layers,
    refuse_decoding_form,
    refuse_unsupported,
    require,
)

TARGET = "Hugging Face MarianMT"


def marian_permutation(d_model: int) -> Tensor:
    """P with marian_vector = our_vector[P]: the even (sine) features, then the odd (cosine)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(model: Transformer) -> Any:
    """The MarianConfig of our architecture (dropouts kept, so that fine-tuning regularises alike)."""
    transformers = require("transformers", TARGET)
    c = model.cfg
    refuse_unsupported(c, TARGET, supported={"activation", "output_bias"})
    return transformers.MarianConfig(
        vocab_size=c.vocab_size,
        decoder_vocab_size=c.vocab_size,
        d_model=c.d_model,
        encoder_layers=c.N_enc,
        decoder_layers=c.N_dec,
        encoder_attention_heads=c.h,
        decoder_attention_heads=c.h,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        max_position_embeddings=c.max_len,
        scale_embedding=True,
        dropout=c.P_drop,
        attention_dropout=c.attention_dropout,
        activation_dropout=0.0,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=True,
    )


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights under MarianMTModel's names, the model dimension permuted by P (module doc)."""
    c = model.cfg
    P = marian_permutation(c.d_model)
    state: dict[str, Tensor] = {}

    def reads(name: str, linear: torch.nn.Linear) -> None:  # input side is the residual stream
        state[f"{name}.weight"], state[f"{name}.bias"] = linear.weight[:, P], linear.bias

    def writes(name: str, module: torch.nn.Linear | torch.nn.LayerNorm) -> None:  # output: residual
        state[f"{name}.weight"], state[f"{name}.bias"] = module.weight[P], module.bias[P]

    def split(name: str, linear: torch.nn.Linear, parts: str) -> None:  # W_QKV / W_KV -> q_proj ...
        for part, w, b in zip(
            parts, linear.weight[:, P].chunk(len(parts)), linear.bias.chunk(len(parts))
        ):
            state[f"{name}.{part}_proj.weight"], state[f"{name}.{part}_proj.bias"] = w, b

    src_emb, tgt_emb = model.src_embed.tokens.weight[:, P], model.tgt_embed.tokens.weight[:, P]
    state["model.encoder.embed_tokens.weight"] = src_emb
    state["model.decoder.embed_tokens.weight"] = state["lm_head.weight"] = tgt_emb
    if c.share_embeddings:
        state["model.shared.weight"] = src_emb
    encoder, decoder = layers(model)
    for i, layer in enumerate(encoder):
        p = f"model.encoder.layers.{i}"
        split(f"{p}.self_attn", layer.self_attn.W_QKV, "qkv")
        writes(f"{p}.self_attn.out_proj", layer.self_attn.W_O)
        writes(f"{p}.self_attn_layer_norm", layer.self_attn_norm)
        reads(f"{p}.fc1", layer.feed_forward.W_1)
        writes(f"{p}.fc2", layer.feed_forward.W_2)
        writes(f"{p}.final_layer_norm", layer.ffn_norm)
    for i, dlayer in enumerate(decoder):
        p = f"model.decoder.layers.{i}"
        split(f"{p}.self_attn", dlayer.self_attn.W_QKV, "qkv")
        writes(f"{p}.self_attn.out_proj", dlayer.self_attn.W_O)
        writes(f"{p}.self_attn_layer_norm", dlayer.self_attn_norm)
        reads(f"{p}.encoder_attn.q_proj", dlayer.src_attn.W_Q)
        split(f"{p}.encoder_attn", dlayer.src_attn.W_KV, "kv")
        writes(f"{p}.encoder_attn.out_proj", dlayer.src_attn.W_O)
        writes(f"{p}.encoder_attn_layer_norm", dlayer.src_attn_norm)
        reads(f"{p}.fc1", dlayer.feed_forward.W_1)
        writes(f"{p}.fc2", dlayer.feed_forward.W_2)
        writes(f"{p}.final_layer_norm", dlayer.ffn_norm)
    return {name: t.detach().float().contiguous() for name, t in state.items()}


def to_marian(model: Transformer, decode: DecodeConfig = DecodeConfig()) -> Any:
    """A MarianMTModel (eval mode, CPU) computing the same logits as ``model``."""
    transformers = require("transformers", TARGET)
    c = model.cfg
    config = marian_config(model)
    refuse_decoding_form(model)
    hf = transformers.MarianMTModel(config).eval()
    state = marian_state_dict(model)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # Positions are recomputed by Marian; the output bias is zero (we have none).
    missing = [
        k for k in missing if not k.endswith(("embed_positions.weight", "final_logits_bias"))
    ]
    if missing or unexpected:
        raise RuntimeError(
            f"MarianMTModel does not match our weights: missing {missing}, unexpected {unexpected}"
        )
    bias = model.generator.bias
    with torch.no_grad():  # ours, or none: zero
        hf.final_logits_bias.copy_(torch.zeros(1, c.vocab_size) if bias is None else bias[None])
    hf.generation_config = generation_config(model, decode)
    return hf


def generation_config(model: Transformer, decode: DecodeConfig) -> Any:
    """``generate`` defaults as close to our decoding as HF allows: beam, length-penalty alpha
    (HF divides by |Y|^alpha, not GNMT's ((5 + |Y|) / 6)^alpha), pad and bos never generated,
    outputs up to the model's positions (HF has no per-sentence limit like src_len + 50)."""
    transformers = require("transformers", TARGET)
    return transformers.GenerationConfig(
        num_beams=decode.beam,
        length_penalty=decode.alpha,
        early_stopping=False,
        max_length=model.cfg.max_len,
        bad_words_ids=[[PAD_ID], [BOS_ID]],
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )


def save_tokenizer(vocab: Any, out: Path, max_len: int) -> None:
    """MarianTokenizer files in ``out``: our SentencePiece model (both sides), or our two
    (``data.pieces``), and vocab.json."""
    transformers = require("transformers", TARGET)
    pieces = {vocab.id_to_piece(i): i for i in range(len(vocab))}
    (out / "vocab.json").write_text(
        json.dumps(pieces, ensure_ascii=False, indent=0), encoding="utf-8"
    )
    for name, side in (("source.spm", "source_path"), ("target.spm", "target_path")):
        shutil.copyfile(getattr(vocab, side, vocab.path), out / name)
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,  # " ." is the text, not a tokenisation artefact
    )
    tokenizer.save_pretrained(str(out))


def export_hf(
    model: Transformer,
    vocab: Any,
    out: str | os.PathLike,
    decode: DecodeConfig = DecodeConfig(),
    source: str | None = None,
) -> Path:
    """Write ``model`` + ``vocab`` as a MarianMT directory that ``from_pretrained`` loads."""
    check_vocab_size(model.cfg, vocab)
    if isinstance(vocab, MosesBpeVocab):
        raise ExportError(
            f"{source or vocab.path}: its text is split by {vocab.kind}; a MarianTokenizer "
            "splits with SentencePiece models only"
        )
    hf = to_marian(model, decode)
    info = {"format": "hf", "model": "MarianMTModel", "source": source}
    with export_dir(out, info) as tmp:
        hf.save_pretrained(str(tmp))
        save_tokenizer(vocab, tmp, model.cfg.max_len)
    return Path(out)
