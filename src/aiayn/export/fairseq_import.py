"""Import a fairseq translation checkpoint (``model.pt`` + ``dict.SRC.txt`` / ``dict.TGT.txt``)
as a checkpoint, with what splits its text: its SentencePiece model(s), or Moses tokenization
and its subword-nmt BPE codes (``data.moses_bpe``, as the WMT16 EN-DE download has them).

    aiayn import wmt-model/ --out runs/fairseq/imported --spm wmt-model/sentencepiece.bpe.model
    aiayn import wmt16.en-de.joined-dict.transformer/ --out runs/fairseq/wmt16  # its bpecodes

fairseq's ``transformer`` architectures are the paper's model; what differs maps to options of
``ModelConfig``: the positions are the sinusoids of ``SinusoidalPositionalEmbedding`` (Marian's
timescales, sines then cosines, from position padding_idx + 1 = 2: ``positional="fairseq"``,
the model dimension un-permuted as for Marian's), and ``*_normalize_before`` is ``norm="pre"``.
The tensor names are MarianMT's without ``model.``, so ``marian_import.load_marian_weights``
fills the layers. The ids are fairseq's (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3)
placed at ours (pad 0, unk 1, bos 2, eos 3): fairseq's decoder starts from ``</s>``, so our bos
row is ``</s>``'s embedding with output bias -100 (never chosen; every other log-probability
is fairseq's), and ``<s>`` is an ordinary piece. Separate dictionaries become one table, their
union, as for Marian's (``marian_npz.joint_layout``). What the model cannot represent (learned
positions, an output layer of its own, layernorm_embedding, adaptive softmax, ...) is refused in
one line naming the option. The checkpoint records fairseq-generate's beam 5 and lenpen 1 as its
defaults under ``--search-rules fairseq``.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.moses_bpe import BpeCodes, check_codes
from ..errors import UserError
from ..model import Transformer
from . import fairseq_load as fl
from .common import ExportError
from .hf import marian_permutation
from .marian_import import (
    PAD_LOGIT_BIAS,
    Layout,
    load_marian_weights,
    marian_tensor,
    write_imported,
)

ARCHITECTURES = {
    "transformer", "transformer_tiny", "transformer_iwslt_de_en", "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t",
}  # fmt: skip
# Options aiayn's Transformer has no counterpart for: accepted at fairseq's default (absent
# means that default), refused at any other value, with what the value means.
MUST_BE: dict[str, tuple[Any, str]] = {
    "encoder_learned_pos": (False, "learned positions"),
    "decoder_learned_pos": (False, "learned positions"),
    "no_token_positional_embeddings": (False, "a model without positions"),
    "no_scale_embedding": (False, "unscaled embeddings"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "adaptive_input": (False, "adaptive input embeddings"),
    "adaptive_softmax_cutoff": (None, "an adaptive softmax"),
    "cross_self_attention": (False, "cross+self-attention"),
    "no_cross_attention": (False, "a decoder without encoder-decoder attention"),
    "no_decoder_final_norm": (False, "a pre-norm decoder without its final LayerNorm"),
    "encoder_layers_to_keep": (None, "pruned layers"),
    "decoder_layers_to_keep": (None, "pruned layers"),
    "scale_attn": (False, "NormFormer's scaling"),
    "scale_fc": (False, "NormFormer's scaling"),
    "scale_heads": (False, "NormFormer's scaling"),
    "scale_resids": (False, "NormFormer's scaling"),
}
# fairseq's base_architecture defaults for options an older checkpoint may not record.
DEFAULTS = {
    "activation_fn": "relu", "dropout": 0.1, "attention_dropout": 0.0,
    "encoder_normalize_before": False, "decoder_normalize_before": False,
    "share_all_embeddings": False, "share_decoder_input_output_embed": False,
    "max_target_positions": 1024,
}  # fmt: skip
SAME = (  # fairseq's pairs aiayn has one option for
    ("encoder_embed_dim", "decoder_embed_dim"),
    ("encoder_embed_dim", "decoder_output_dim"),
    ("encoder_embed_dim", "decoder_input_dim"),
    ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
    ("encoder_attention_heads", "decoder_attention_heads"),
    ("encoder_normalize_before", "decoder_normalize_before"),
)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # fairseq's gelu is erf's, as F.gelu
GENERATE_DEFAULTS = {"beam": 5, "alpha": 1.0}  # fairseq-generate's --beam and --lenpen
IGNORED_TENSORS = ("version", "_float_tensor")  # fairseq's bookkeeping, no weights
CODE_NAMES = ("bpecodes", "code")  # subword-nmt codes beside a model, as fairseq's hub finds them


def option(options: dict[str, Any], key: str, where: Path) -> Any:
    """``key`` of the model's options (``DEFAULTS`` where absent), or a refusal naming it."""
    if key in options and options[key] is not None:
        return options[key]
    if key in DEFAULTS:
        return DEFAULTS[key]
    raise ExportError(f"{where}: the model's options lack {key}")


def check_options(options: dict[str, Any], where: Path) -> None:
    """Refuse, in one line naming the option, what aiayn's Transformer cannot be."""
    arch = options.get("arch", options.get("_name"))
    if arch not in ARCHITECTURES:
        raise ExportError(f"{where}: arch {arch!r} is not one of fairseq's transformer models")
    for key, (value, what) in MUST_BE.items():
        if options.get(key, value) not in (value, None if value is False else value):
            raise ExportError(f"{where}: {key}={options[key]!r} ({what}) cannot be represented")
    for ours, theirs in SAME:
        a, b = option(options, ours, where), options.get(theirs)
        if b is not None and a != b:
            raise ExportError(f"{where}: {ours}={a} and {theirs}={b} differ; aiayn has one")
    shared = option(options, "share_all_embeddings", where)
    if not shared and not option(options, "share_decoder_input_output_embed", where):
        raise ExportError(
            f"{where}: share_decoder_input_output_embed=False (an output layer of its own) "
            "cannot be represented; aiayn ties it to the target embeddings"
        )
    if option(options, "activation_fn", where) not in ACTIVATIONS:
        raise ExportError(
            f"{where}: activation_fn {options['activation_fn']!r}; aiayn has {sorted(ACTIVATIONS)}"
        )
    dropped = {k: options.get(k) for k in ("activation_dropout", "relu_dropout") if options.get(k)}
    if dropped:
        warnings.warn(
            f"{where}: {dropped} has no counterpart: fine-tuning the import runs without it",
            stacklevel=2,
        )


def model_config(options: dict[str, Any], vocab_size: int, where: Path) -> ModelConfig:
    """Our ModelConfig of the checkpoint's (checked) options."""
    get = lambda key: option(options, key, where)  # noqa: E731
    try:
        return ModelConfig(
            N_enc=get("encoder_layers"),
            N_dec=get("decoder_layers"),
            d_model=get("encoder_embed_dim"),
            d_ff=get("encoder_ffn_embed_dim"),
            h=get("encoder_attention_heads"),
            P_drop=float(get("dropout")),
            attention_dropout=float(get("attention_dropout")),
            vocab_size=vocab_size,
            max_len=get("max_target_positions"),
            norm="pre" if get("encoder_normalize_before") else "post",
            positional="fairseq",
            share_embeddings=bool(get("share_all_embeddings")),
            activation=ACTIVATIONS[get("activation_fn")],  # type: ignore[arg-type]
            output_bias=True,
        )
    except (TypeError, UserError) as e:  # a size of the wrong type or value
        raise ExportError(f"{where}: {e}") from None


@dataclass(frozen=True)
class Table:
    """For each of our ids: the fairseq source and target ids whose embeddings it takes
    (``<unk>``'s where that side lacks the symbol), and whether it may be output."""

    source_ids: list[int]
    target_ids: list[int]
    output: list[bool]


def joint_table(source: list[str], target: list[str], where: Path) -> tuple[Layout, Table]:
    """Our table over fairseq's two dictionaries (module doc): pad, unk, a bos row of ours
    (``</s>``'s embedding, never output), ``</s>``; the target's other symbols in fairseq's
    order (``<s>`` first), then the symbols only the source has (never output)."""
    src, tgt = {p: i for i, p in enumerate(source)}, {p: i for i, p in enumerate(target)}
    bos = next(p for p in ("<bos>", "<start>", "<aiayn-bos>") if p not in src and p not in tgt)
    rest = [p for p in target if p not in ("<pad>", "<unk>", "</s>")]
    rest += [p for p in source if p not in tgt]
    pieces = ["<pad>", "<unk>", bos, "</s>", *rest]
    table = Table(
        [fl.EOS if p == bos else src.get(p, fl.UNK) for p in pieces],
        [fl.EOS if p == bos else tgt.get(p, fl.UNK) for p in pieces],
        [p in tgt and p != bos for p in pieces],
    )
    return Layout(list(range(len(pieces))), pieces), table


def modern_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """fairseq's current names for an older checkpoint's tensors, as its upgrade_state_dict
    renames them: a joined ``in_proj`` split into q, k, v; ``layer_norms.0/1`` named."""
    out: dict[str, Tensor] = {}
    for name, value in state.items():
        joined = re.fullmatch(r"(.*)\.in_proj_(weight|bias)", name)
        if joined:
            for part, chunk in zip("qkv", value.chunk(3)):
                out[f"{joined[1]}.{part}_proj.{joined[2]}"] = chunk
            continue
        name = re.sub(
            r"^(encoder\.layers\.\d+)\.layer_norms\.0\.", r"\1.self_attn_layer_norm.", name
        )
        out[re.sub(r"^(encoder\.layers\.\d+)\.layer_norms\.1\.", r"\1.final_layer_norm.", name)] = (
            value
        )
    return out


def embedding(state: dict[str, Tensor], name: str, rows: int, where: Path) -> Tensor:
    """fairseq's embedding matrix ``name``, which the dictionary says has ``rows`` rows."""
    if name not in state:
        raise ExportError(f"{where}: no tensor {name}")
    if state[name].size(0) != rows:
        raise ExportError(
            f"{where}: {name} has {state[name].size(0)} rows, the dictionary {rows} symbols: "
            "the dict.*.txt files are not this model's"
        )
    return state[name]


def load_weights(model: Transformer, state: dict[str, Tensor], table: Table, where: Path) -> None:
    """Fill ``model`` from fairseq's ``state``: the embeddings in our ids, the layers through
    ``load_marian_weights`` (MarianMT's names), pre-norm's final norms, the output bias."""
    n_src, n_tgt = max(table.source_ids) + 1, max(table.target_ids) + 1
    renamed = {f"model.{k}": v for k, v in state.items() if not k.endswith(IGNORED_TENSORS)}
    src = embedding(state, "encoder.embed_tokens.weight", n_src, where)
    renamed["model.encoder.embed_tokens.weight"] = src[table.source_ids]
    renamed.pop("model.decoder.embed_tokens.weight", None)  # shared: the encoder's
    if not model.cfg.share_embeddings:
        tgt = embedding(state, "decoder.embed_tokens.weight", n_tgt, where)
        renamed["model.decoder.embed_tokens.weight"] = tgt[table.target_ids]
    renamed.pop("model.decoder.output_projection.weight", None)  # tied: the embeddings
    layout = Layout(list(range(len(table.output))), [])
    used = load_marian_weights(model, renamed, layout)
    if model.cfg.norm == "pre":
        Q = torch.argsort(marian_permutation(model.cfg.d_model))
        for norm, name in ((model.enc_norm, "encoder"), (model.dec_norm, "decoder")):
            for part in ("weight", "bias"):
                key = f"model.{name}.layer_norm.{part}"
                getattr(norm, part).copy_(marian_tensor(renamed, key, (model.cfg.d_model,))[Q])
                used.add(key)
    never = torch.tensor([not out for out in table.output])
    model.generator.bias.copy_(torch.zeros(len(table.output)).masked_fill(never, PAD_LOGIT_BIAS))
    unused = sorted(k[len("model.") :] for k in renamed if k not in used)
    if unused:
        raise ExportError(f"{where}: tensors the options do not explain: {', '.join(unused[:5])}")


def splitter(
    directory: Path,
    options: dict[str, Any],
    spm: tuple[Path | None, Path | None],
    bpe_codes: Path | None,
) -> tuple[Path, Path] | BpeCodes:
    """What splits the text: the (source, target) SentencePiece models given, else the BPE
    codes given, else the directory's one ``*.model`` for both sides, else its subword-nmt
    codes (``bpecodes`` or ``code``, the names fairseq's hub reads) after Moses tokenization as
    the checkpoint's ``options`` set it: its languages, dash splits and escapes
    (``data.moses_bpe``)."""
    source, target = spm
    if bpe_codes is not None and (source or target):
        raise ExportError("give SentencePiece models (--spm) or BPE codes (--bpe-codes), not both")
    if source or target:
        return source or target, target or source  # type: ignore[return-value]
    if bpe_codes is None:
        found = sorted(directory.glob("*.model"))
        if len(found) == 1:
            return found[0], found[0]
        codes = [directory / name for name in CODE_NAMES if (directory / name).is_file()]
        if found or not codes:
            raise ExportError(
                f"{directory}: {'more than one' if found else 'no'} SentencePiece *.model"
                f"{'' if found else ' and no BPE codes (bpecodes)'}; give what split the text "
                "with --spm or --bpe-codes"
            )
        bpe_codes = codes[0]
    check_codes(bpe_codes)  # a damaged file named here, not as its copy
    return BpeCodes(
        bpe_codes,
        fl.languages(options, directory),
        dash_splits=not options.get("moses_no_dash_splits"),
        escape=not options.get("moses_no_escape"),
    )


def read_fairseq(path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The .pt of ``path`` (itself, or the one in the directory), its contents and its
    model's options, checked (``check_options``)."""
    pt = fl.find_checkpoint(path)
    checkpoint = fl.read_checkpoint(pt)
    options = fl.model_options(checkpoint, pt)
    check_options(options, pt)
    return pt, checkpoint, options


def build(
    pt: Path, checkpoint: dict[str, Any], options: dict[str, Any]
) -> tuple[Transformer, Layout]:
    """The Transformer (eval mode, CPU) of ``read_fairseq``'s parts and its vocabulary layout."""
    source_dict, target_dict = fl.dictionaries(pt.parent, options, pt)
    source, target = fl.read_dictionary(source_dict), fl.read_dictionary(target_dict)
    shared = bool(option(options, "share_all_embeddings", pt))
    if shared and source != target:
        raise ExportError(
            f"{pt}: share_all_embeddings needs one dictionary; {source_dict} and {target_dict} differ"
        )
    layout, table = joint_table(source, target, pt)
    state = modern_names(fl.weights(checkpoint, pt))
    model = Transformer(model_config(options, len(layout.pieces), pt))
    with torch.no_grad():
        load_weights(model, state, table, pt)
    return model.eval(), layout


def fairseq_to_transformer(path: Path) -> tuple[Transformer, Layout]:
    """The Transformer (eval mode, CPU) of fairseq checkpoint ``path`` (a .pt, or the
    directory holding it and its dictionaries) and its vocabulary layout."""
    return build(*read_fairseq(path))


def import_fairseq(
    path: str | os.PathLike,
    out: str | os.PathLike,
    spm: tuple[str | os.PathLike | None, str | os.PathLike | None] = (None, None),
    bpe_codes: str | os.PathLike | None = None,
    languages: tuple[str | None, str | None] = (None, None),
) -> Path:
    """Write fairseq checkpoint ``path`` as the checkpoint directory ``out`` (must not exist),
    its text split by ``spm`` (source, target; one for both) or ``bpe_codes``, else by what
    lies beside it (``splitter``). ``languages`` (source, target) name its dictionaries where
    the checkpoint does not (``fl.given_languages``)."""
    pt, checkpoint, options = read_fairseq(Path(path))
    options = fl.given_languages(options, languages, pt)
    given = tuple(Path(p) if p is not None else None for p in spm)
    codes = Path(bpe_codes) if bpe_codes is not None else None
    split = splitter(pt.parent, options, (given[0], given[1]), codes)
    model, layout = build(pt, checkpoint, options)
    defaults = {"fairseq": dict(GENERATE_DEFAULTS)}
    return write_imported(
        model, layout.pieces, split, pt.parent, Path(out), search_defaults=defaults
    )
