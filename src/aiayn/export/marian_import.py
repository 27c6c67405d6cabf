"""Import a Hugging Face MarianMT directory (OPUS-MT models) as an aiayn checkpoint.

    aiayn import opus-mt-en-es --out runs/opus-en-es/imported

MarianMT is the paper's Transformer (post-LN, sinusoids, scaled embeddings, tied output layer)
with three differences this importer maps to options of ``ModelConfig``: the feed-forward's
``activation_function`` (OPUS-MT: swish) is ``activation``, the output layer's bias
(``final_logits_bias``) is ``output_bias``, and the source and target sides are split by
their own SentencePiece models into one table of pieces (``data.pieces``). The weights are
``export.hf``'s mapping run backwards: the model dimension un-permuted (Marian's positional
table is sines then cosines, ours interleaved) and the vocabulary reordered so that the
project's special ids hold (pad 0, unk 1, bos 2, eos 3).

OPUS-MT decoders start from pad: its row becomes our bos, and our pad gets a row of its own
(zero embedding, output bias -100, so that the softmax gives it no mass and every other
token's log-probability is Marian's). Nothing is executed to read the directory: config.json
and the tokenizer's files are JSON, the weights safetensors (or ``pytorch_model.bin`` loaded
with ``weights_only=True``). What the model cannot represent (another architecture, pre-norm,
unscaled embeddings, a config field it does not map set to a value other than its default) is
refused in one line naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from ..checkpoint import META, WEIGHTS, save_weights
from ..config import ModelConfig
from ..data.pieces import TwoModelVocab
from ..data.vocab import BOS_ID
from ..files import check_not_input, check_parent, publish_dir, temp_dir_beside
from ..model import Transformer
from .common import ExportError
from .hf import marian_permutation

PAD_LOGIT_BIAS = -100.0  # our extra pad row's output bias: e^-100 of the softmax, i.e. none
# Fields that shape no weight and no forward pass: metadata, training-only initialisation,
# generation settings (aiayn's decoding options stand for those).
IGNORED = {
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype",
    "use_cache", "init_std", "id2label", "label2id", "num_hidden_layers", "is_decoder",
    "is_encoder_decoder", "model_type", "bos_token_id", "forced_eos_token_id", "bad_words_ids",
    "max_length", "min_length", "num_beams", "length_penalty", "early_stopping",
    "extra_pos_embeddings", "classif_dropout", "classifier_dropout", "gradient_checkpointing",
    "output_past", "num_return_sequences", "no_repeat_ngram_size", "do_sample", "_num_labels",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "diversity_penalty",
    "num_beam_groups", "encoder_no_repeat_ngram_size", "forced_bos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "output_scores", "return_dict_in_generate", "sep_token_id",
    "chunk_size_feed_forward", "return_dict", "output_hidden_states", "output_attentions",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "problem_type",
}  # fmt: skip
# Fields the model has no option for, at their default (transformers' PretrainedConfig's):
# accepted there, refused at any other value.
AT_DEFAULT = {
    "torchscript": False,
    "tie_encoder_decoder": False,
    "pruned_heads": {},
    "add_cross_attention": False,
    "cross_attention_hidden_size": None,
}
# Fields the model has no option for: accepted at these values (absent: MarianConfig's default).
REQUIRED = {
    "scale_embedding": (True, False),
    "tie_word_embeddings": (True, True),
    "normalize_before": (False, False),
    "add_final_layer_norm": (False, False),
    "normalize_embedding": (False, False),
    "static_position_embeddings": (True, True),
    "add_bias_logits": (False, False),
    "activation_dropout": (0.0, 0.0),
    "encoder_layerdrop": (0.0, 0.0),
    "decoder_layerdrop": (0.0, 0.0),
}
MAPPED = {
    "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size",
    "decoder_vocab_size", "max_position_embeddings", "dropout", "attention_dropout",
    "activation_function", "share_encoder_decoder_embeddings", "pad_token_id", "eos_token_id",
    "decoder_start_token_id",
}  # fmt: skip
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}


def _json(path: Path) -> Any:
    if not path.is_file():
        raise ExportError(f"{path} does not exist: not a MarianMT directory (save_pretrained)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from None


def _same(a: Any, b: Any) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)  # 0 is not False for a flag


def check_config(config: dict[str, Any], where: Path) -> None:
    """Refuse, in one line naming the field, what ``model_config`` cannot map."""
    if config.get("model_type") != "marian":
        raise ExportError(f"{where}: model_type {config.get('model_type')!r}, not 'marian'")
    if config.get("architectures", ["MarianMTModel"]) != ["MarianMTModel"]:
        raise ExportError(f"{where}: architectures {config['architectures']}, not MarianMTModel")
    for key, value in config.items():
        if key in REQUIRED:
            if not _same(value, REQUIRED[key][0]):
                raise ExportError(
                    f"{where}: {key}={value!r} cannot be represented (need {REQUIRED[key][0]!r})"
                )
        elif key in AT_DEFAULT:
            if not _same(value, AT_DEFAULT[key]):
                raise ExportError(
                    f"{where}: {key}={value!r} (default {AT_DEFAULT[key]!r}) cannot be represented"
                )
        elif key not in IGNORED | MAPPED:
            raise ExportError(
                f"{where}: field {key}={value!r} is not one aiayn maps; not importing"
            )
    for key, (value, default) in REQUIRED.items():
        if key not in config and not _same(default, value):
            raise ExportError(f"{where}: {key} absent (default {default!r}) cannot be represented")
    for ours, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(ours) != config.get(theirs):
            raise ExportError(
                f"{where}: {ours}={config.get(ours)} and {theirs}={config.get(theirs)} differ; aiayn has one"
            )
    if config.get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        raise ExportError(
            f"{where}: decoder_vocab_size differs from vocab_size (separate vocabularies)"
        )
    if config.get("activation_function", "gelu") not in ACTIVATIONS:
        raise ExportError(f"{where}: activation_function {config['activation_function']!r}; aiayn has {sorted(ACTIVATIONS)}")  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """Where our ids come from: ``order[i]`` is the Marian id of our id i (-1: a row of our own,
    the pad of a decoder that starts from pad), and the piece each of our ids is named by."""

    order: list[int]
    pieces: list[str]


def vocabulary_layout(marian_vocab: dict[str, int], config: dict[str, Any], where: Path) -> Layout:
    """Our ids over Marian's: the four special ids first (``module doc``), the rest in order."""
    size = config["vocab_size"]
    if sorted(marian_vocab.values()) != list(range(size)):
        raise ExportError(f"{where}: ids are not 0..{size - 1} once each (vocab_size {size})")
    piece_of = {i: p for p, i in marian_vocab.items()}
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    unk = marian_vocab.get("<unk>")
    if unk is None or len({pad, eos, unk}) < 3 or start in (eos, unk) or not isinstance(eos, int):
        raise ExportError(
            f"{where}: pad {pad}, eos {eos}, unk {unk}, start {start}: need distinct ids"
        )
    own_pad = start == pad
    special = [-1 if own_pad else pad, unk, start, eos]
    order = special + [i for i in range(size) if i not in special]
    pieces = [piece_of[i] if i >= 0 else piece_of[pad] for i in order]
    if own_pad:  # the start row keeps Marian's pad piece's name; bos needs another
        pieces[BOS_ID] = next(p for p in ("<s>", "<bos>", "<start>") if p not in marian_vocab)
    return Layout(order, pieces)


def read_weights(directory: Path) -> dict[str, Tensor]:
    """The MarianMTModel's tensors: safetensors, else a weights-only ``pytorch_model.bin``."""
    if (path := directory / "model.safetensors").is_file():
        try:
            return load_file(str(path))
        except SafetensorError as e:
            raise ExportError(f"{path}: not a readable safetensors file ({e})") from None
    path = directory / "pytorch_model.bin"
    if not path.is_file():
        raise ExportError(f"{directory}: no model.safetensors or pytorch_model.bin")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError) as e:
        raise ExportError(f"{path}: not a plain weights file ({str(e).splitlines()[0]})") from None


def model_config(config: dict[str, Any], vocab_size: int, output_bias: bool) -> ModelConfig:
    return ModelConfig(
        N_enc=config["encoder_layers"],
        N_dec=config["decoder_layers"],
        d_model=config["d_model"],
        d_ff=config["encoder_ffn_dim"],
        h=config["encoder_attention_heads"],
        P_drop=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        vocab_size=vocab_size,
        max_len=config.get("max_position_embeddings", 1024),
        activation=ACTIVATIONS[config.get("activation_function", "gelu")],  # type: ignore[arg-type]
        share_embeddings=config.get("share_encoder_decoder_embeddings", True),
        output_bias=output_bias,
    )


def load_marian_weights(model: Transformer, state: dict[str, Tensor], layout: Layout) -> None:
    """Fill ``model`` with Marian's ``state``: ``export.hf.marian_state_dict`` backwards."""
    c = model.cfg
    Q = torch.argsort(marian_permutation(c.d_model))  # ours = marian[Q]
    order = torch.tensor(layout.order)
    rows, own = order.clamp(min=0), order < 0

    def get(name: str) -> Tensor:
        if name not in state:
            raise ExportError(f"the weights have no {name}")
        return state[name].float()

    def reads(linear: torch.nn.Linear, name: str) -> None:
        linear.weight.copy_(get(f"{name}.weight")[:, Q])
        linear.bias.copy_(get(f"{name}.bias"))

    def writes(module: torch.nn.Module, name: str) -> None:
        module.weight.copy_(get(f"{name}.weight")[Q])
        module.bias.copy_(get(f"{name}.bias")[Q])

    def joined(linear: torch.nn.Linear, name: str, parts: str) -> None:
        linear.weight.copy_(torch.cat([get(f"{name}.{p}_proj.weight") for p in parts])[:, Q])
        linear.bias.copy_(torch.cat([get(f"{name}.{p}_proj.bias") for p in parts]))

    def embedding(tokens: torch.nn.Embedding, *names: str) -> None:
        matrix = get(next((n for n in names if n in state), names[-1]))[rows][:, Q]
        tokens.weight.copy_(matrix.masked_fill(own[:, None], 0.0))

    shared = "model.shared.weight"
    embedding(model.src_embed.tokens, "model.encoder.embed_tokens.weight", shared)
    if not c.share_embeddings:
        embedding(model.tgt_embed.tokens, "model.decoder.embed_tokens.weight", shared)
    if c.output_bias:
        bias = state.get("final_logits_bias", torch.zeros(1, len(order))).float().reshape(-1)
        model.generator.bias.copy_(bias[rows].masked_fill(own, PAD_LOGIT_BIAS))
    for i, layer in enumerate(model.encoder):
        p = f"model.encoder.layers.{i}"
        joined(layer.self_attn.W_QKV, f"{p}.self_attn", "qkv")
        writes(layer.self_attn.W_O, f"{p}.self_attn.out_proj")
        writes(layer.self_attn_norm, f"{p}.self_attn_layer_norm")
        reads(layer.feed_forward.W_1, f"{p}.fc1")
        writes(layer.feed_forward.W_2, f"{p}.fc2")
        writes(layer.ffn_norm, f"{p}.final_layer_norm")
    for i, layer in enumerate(model.decoder):
        p = f"model.decoder.layers.{i}"
        joined(layer.self_attn.W_QKV, f"{p}.self_attn", "qkv")
        writes(layer.self_attn.W_O, f"{p}.self_attn.out_proj")
        writes(layer.self_attn_norm, f"{p}.self_attn_layer_norm")
        reads(layer.src_attn.W_Q, f"{p}.encoder_attn.q_proj")
        joined(layer.src_attn.W_KV, f"{p}.encoder_attn", "kv")
        writes(layer.src_attn.W_O, f"{p}.encoder_attn.out_proj")
        writes(layer.src_attn_norm, f"{p}.encoder_attn_layer_norm")
        reads(layer.feed_forward.W_1, f"{p}.fc1")
        writes(layer.feed_forward.W_2, f"{p}.fc2")
        writes(layer.ffn_norm, f"{p}.final_layer_norm")


def check_tokenizer(directory: Path) -> None:
    """Refuse what ``TwoModelVocab`` does not do: a separate target table."""
    path = directory / "tokenizer_config.json"
    settings = _json(path) if path.is_file() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise ExportError(f"{directory}: separate source and target vocabularies (separate_vocabs)")
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ExportError(f"{directory / name} does not exist: a MarianTokenizer needs it")


def marian_to_transformer(directory: Path) -> tuple[Transformer, Layout]:
    """The Transformer (eval mode, CPU) of MarianMT ``directory`` and its vocabulary layout."""
    config = _json(directory / "config.json")
    check_config(config, directory / "config.json")
    check_tokenizer(directory)
    layout = vocabulary_layout(_json(directory / "vocab.json"), config, directory / "vocab.json")
    state = read_weights(directory)
    bias = state.get("final_logits_bias")
    own_pad = -1 in layout.order
    output_bias = own_pad or (bias is not None and bool(bias.ne(0).any()))
    model = Transformer(model_config(config, len(layout.order), output_bias))
    with torch.no_grad():
        load_marian_weights(model, state, layout)
    return model.eval(), layout


def import_marian(directory: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write MarianMT ``directory`` as the checkpoint directory ``out`` (weights, meta.json and
    the two SentencePiece models with their table); ``out`` must not exist yet."""
    directory, out = Path(directory), Path(out)
    model, layout = marian_to_transformer(directory)
    spms = (directory / "source.spm", directory / "target.spm")
    return write_imported(model, layout.pieces, spms, directory, out)


def write_imported(
    model: Transformer, pieces: list[str], spms: tuple[Path, Path], directory: Path, out: Path
) -> Path:
    """Write an imported ``model`` with its table of ``pieces`` and its (source, target)
    SentencePiece models as the new checkpoint directory ``out`` (Marian's .npz import too)."""
    check_not_input(out, [directory], option="--out", whole_dir=True)
    if out.exists() or out.is_symlink():
        raise ExportError(f"--out {out} exists; choose a new directory")
    check_parent(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        vocab = TwoModelVocab.write(tmp, spms[0], spms[1], pieces)
        save_weights(model, tmp / WEIGHTS)
        meta = {
            "model_config": dataclasses.asdict(model.cfg),
            "imported_from": str(directory),
            "vocab_fingerprint": vocab.fingerprint,
        }
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when published
    return out
