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
import math
import os
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from ..checkpoint import META, WEIGHTS, save_weights
from ..config import ModelConfig
from ..data.moses_bpe import BpeCodes, MosesBpeVocab
from ..data.pieces import AnyVocab, TwoModelVocab, sentencepiece_model
from ..data.vocab import BOS_ID, PAD_ID, target_languages
from ..files import check_not_input, check_parent, publish_dir, temp_dir_beside
from ..model import Transformer
from .common import ExportError, layers
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
# Tensors that hold nothing of their own: the sinusoids (computed), the tied output layer and
# embeddings (copies of model.shared), the output bias when it is all zeros (else read).
DERIVED = ("embed_positions.weight", "lm_head.weight", "embed_tokens.weight", "final_logits_bias")
# generate()'s settings aiayn's search reproduces, at transformers' GenerationConfig defaults
# (what generate() does where the model sets none), and our name for each.
GENERATE = {
    "num_beams": (1, "beam"),
    "length_penalty": (1.0, "alpha"),
    "max_length": (20, "max_len"),
    "min_length": (0, "min_len"),
    "no_repeat_ngram_size": (0, "no_repeat_ngram_size"),
    "repetition_penalty": (1.0, "repetition_penalty"),
}
# generate()'s settings it does not reproduce, at their defaults: another value is warned of.
NOT_REPRODUCED = {
    "do_sample": False, "early_stopping": False, "num_beam_groups": 1, "max_new_tokens": None,
    "min_new_tokens": None, "diversity_penalty": 0.0, "encoder_no_repeat_ngram_size": 0,
    "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "forced_bos_token_id": None,
}  # fmt: skip


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
    if not (isinstance(pad, int) and isinstance(eos, int) and isinstance(start, int)) or (
        unk is None or len({pad, eos, unk}) < 3 or start in (eos, unk)
    ):
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


def marian_tensor(state: dict[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    """Marian's tensor ``name`` in float32, which config.json's sizes say is ``shape``: a
    config that disagrees with the weights is named, not a traceback (or, where a slice
    fits, a model silently cut)."""
    if name not in state:
        raise ExportError(f"the weights have no {name}")
    if tuple(state[name].shape) != shape:
        raise ExportError(
            f"{name}: the weights hold {tuple(state[name].shape)}, config.json's sizes make "
            f"it {shape}: config.json does not match the weights"
        )
    return state[name].float()


def load_marian_weights(model: Transformer, state: dict[str, Tensor], layout: Layout) -> set[str]:
    """Fill ``model`` from Marian's ``state`` (``export.hf``'s mapping backwards); names read."""
    c = model.cfg
    Q = torch.argsort(marian_permutation(c.d_model))  # ours = marian[Q]
    order = torch.tensor(layout.order)
    rows, own = order.clamp(min=0), order < 0
    marian, used = int(rows.max()) + 1, set()  # the embedding rows the layout reads; names

    def get(name: str, *shape: int) -> Tensor:
        used.add(name)
        return marian_tensor(state, name, shape)

    def reads(linear: torch.nn.Linear, name: str) -> None:
        linear.weight.copy_(get(f"{name}.weight", *linear.weight.shape)[:, Q])
        linear.bias.copy_(get(f"{name}.bias", *linear.bias.shape))

    def writes(module: torch.nn.Linear | torch.nn.LayerNorm, name: str) -> None:
        module.weight.copy_(get(f"{name}.weight", *module.weight.shape)[Q])
        module.bias.copy_(get(f"{name}.bias", *module.bias.shape)[Q])

    def joined(linear: torch.nn.Linear, name: str, parts: str) -> None:
        width = linear.weight.size(0) // len(parts)
        weights = [get(f"{name}.{p}_proj.weight", width, c.d_model) for p in parts]
        linear.weight.copy_(torch.cat(weights)[:, Q])
        linear.bias.copy_(torch.cat([get(f"{name}.{p}_proj.bias", width) for p in parts]))

    def embedding(tokens: torch.nn.Embedding, *names: str) -> None:
        name = next((n for n in names if n in state), names[-1])
        matrix = get(name, marian, c.d_model)[rows][:, Q]
        tokens.weight.copy_(matrix.masked_fill(own[:, None], 0.0))

    shared = "model.shared.weight"
    embedding(model.src_embed.tokens, "model.encoder.embed_tokens.weight", shared)
    if not c.share_embeddings:
        embedding(model.tgt_embed.tokens, "model.decoder.embed_tokens.weight", shared)
    if c.output_bias:
        name = "final_logits_bias"
        bias = get(name, 1, marian) if name in state else torch.zeros(1, marian)
        model.generator.bias.copy_(bias.reshape(-1)[rows].masked_fill(own, PAD_LOGIT_BIAS))
    encoder, decoder = layers(model)
    for i, layer in enumerate(encoder):
        p = f"model.encoder.layers.{i}"
        joined(layer.self_attn.W_QKV, f"{p}.self_attn", "qkv")
        writes(layer.self_attn.W_O, f"{p}.self_attn.out_proj")
        writes(layer.self_attn_norm, f"{p}.self_attn_layer_norm")
        reads(layer.feed_forward.W_1, f"{p}.fc1")
        writes(layer.feed_forward.W_2, f"{p}.fc2")
        writes(layer.ffn_norm, f"{p}.final_layer_norm")
    for i, dlayer in enumerate(decoder):
        p = f"model.decoder.layers.{i}"
        joined(dlayer.self_attn.W_QKV, f"{p}.self_attn", "qkv")
        writes(dlayer.self_attn.W_O, f"{p}.self_attn.out_proj")
        writes(dlayer.self_attn_norm, f"{p}.self_attn_layer_norm")
        reads(dlayer.src_attn.W_Q, f"{p}.encoder_attn.q_proj")
        joined(dlayer.src_attn.W_KV, f"{p}.encoder_attn", "kv")
        writes(dlayer.src_attn.W_O, f"{p}.encoder_attn.out_proj")
        writes(dlayer.src_attn_norm, f"{p}.encoder_attn_layer_norm")
        reads(dlayer.feed_forward.W_1, f"{p}.fc1")
        writes(dlayer.feed_forward.W_2, f"{p}.fc2")
        writes(dlayer.ffn_norm, f"{p}.final_layer_norm")
    return used


def check_tokenizer(directory: Path) -> None:
    """Refuse what ``TwoModelVocab`` does not do: a separate target table."""
    path = directory / "tokenizer_config.json"
    settings = _json(path) if path.is_file() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise ExportError(f"{directory}: separate source and target vocabularies (separate_vocabs)")
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ExportError(f"{directory / name} does not exist: a MarianTokenizer needs it")
        sentencepiece_model(directory / name)  # damaged: named here, not as its copy


def _generate_value(key: str, value: Any, where: Path) -> Any:
    """``value`` of generate()'s ``key`` in our terms, or an ExportError naming it."""
    least = {"num_beams": 1, "max_length": 2}.get(key, 0)
    if key in ("length_penalty", "repetition_penalty"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (key == "length_penalty" or value > 0)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
    if not ok:
        raise ExportError(f"{where}: {key}={value!r} is not a setting generate() can run")
    return value - 1 if key == "max_length" else value  # our max_len has no start token


def generation_defaults(directory: Path, layout: Layout) -> dict[str, Any]:
    """What transformers' ``generate()`` does with the model, as aiayn's search options:
    ``generation_config.json`` (else ``config.json``, as transformers falls back), with
    GenerationConfig's defaults where it sets none. What the search does not do is warned
    of: the checkpoint records these as its defaults under ``--search-rules hf``."""
    where = directory / "generation_config.json"
    if not where.is_file():
        where = directory / "config.json"
    settings = _json(where)
    own = {
        ours: _generate_value(key, settings.get(key, default), where)
        for key, (default, ours) in GENERATE.items()
    }
    unlike = [f"{k}={settings[k]!r}" for k, v in NOT_REPRODUCED.items() if settings.get(k, v) != v]
    banned = {layout.order[PAD_ID], layout.order[BOS_ID]}  # never generated by our search
    bad = [w for w in settings.get("bad_words_ids") or [] if len(w) != 1 or w[0] not in banned]
    unlike += [f"bad_words_ids {bad}"] if bad else []
    if unlike:
        warnings.warn(
            f"{where}: aiayn's search does not do {', '.join(unlike)}: under --search-rules hf "
            "it searches as generate() would without them",
            stacklevel=2,
        )
    return own


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
        used = load_marian_weights(model, state, layout)
    unused = sorted(k for k in state if k not in used and not k.endswith(DERIVED))
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        warnings.warn(
            f"{directory}: {len(unused)} tensor(s) the config does not use are not imported: "
            f"{', '.join(unused[:5])}{more}",
            stacklevel=2,
        )
    return model.eval(), layout


def import_marian(directory: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write MarianMT ``directory`` as the checkpoint directory ``out`` (weights, meta.json and
    the two SentencePiece models with their table); ``out`` must not exist yet."""
    directory, out = Path(directory), Path(out)
    model, layout = marian_to_transformer(directory)
    spms = (directory / "source.spm", directory / "target.spm")
    own = {"hf": generation_defaults(directory, layout)}
    return write_imported(model, layout.pieces, spms, directory, out, search_defaults=own)


def write_imported(
    model: Transformer,
    pieces: list[str],
    spms: tuple[Path, Path] | BpeCodes,
    directory: Path,
    out: Path,
    search_defaults: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Write an imported ``model`` with its table of ``pieces`` and its (source, target)
    SentencePiece models (or a fairseq model's BPE codes) as the new checkpoint directory
    ``out`` (Marian's .npz and fairseq's imports too); ``search_defaults``: the model's own
    search settings by search rules (meta.json's)."""
    check_not_input(out, [directory], option="--out", whole_dir=True)
    if out.exists() or out.is_symlink():
        raise ExportError(f"--out {out} exists; choose a new directory")
    check_parent(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        vocab: AnyVocab = (
            MosesBpeVocab.write(tmp, spms, pieces)
            if isinstance(spms, BpeCodes)
            else TwoModelVocab.write(tmp, spms[0], spms[1], pieces)
        )
        save_weights(model, tmp / WEIGHTS)
        meta = {
            "model_config": dataclasses.asdict(model.cfg),
            "imported_from": str(directory),
            "vocab_fingerprint": vocab.fingerprint,
        }
        if search_defaults:
            meta["search_defaults"] = search_defaults
        if languages := target_languages(vocab):  # a multilingual model's >>xx<< tokens
            meta["target_langs"] = list(languages)
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when published
    return out
