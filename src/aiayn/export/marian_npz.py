"""Import a Marian model directory (``model.npz`` + ``decoder.yml`` + vocabularies) as a checkpoint.

    unzip opus-2020-01-08.zip -d opus-mt-en-de    # an OPUS-MT / Tatoeba-Challenge release
    aiayn import opus-mt-en-de --out runs/opus-en-de/imported

Marian's own format, as OPUS-MT, Tatoeba-Challenge and HPLT publish it: the weights an ``.npz``
(read by numpy with ``allow_pickle=False``: nothing executed) holding the training options as
``special:model.yml``; ``decoder.yml`` names the model and the two vocabularies, each a YAML table
of pieces (``*.vocab.yml``, the text split beforehand by ``source.spm``/``target.spm``) or a
SentencePiece model (``*.spm``, Marian's built-in splitting). The tensors are renamed to the
MarianMT names (``W`` matrices transposed: Marian multiplies ``x @ W``) and handed to
``marian_import.load_marian_weights``, so one mapping serves both formats.

What differs from a Hugging Face MarianMT: the positions are Marian's own sinusoids (timescales
10000^(i/(d/2-1)), ``positional="marian"``); LayerNorm's epsilon is Marian's 1e-9; Marian's decoder starts from a zero vector (our bos:
a row of zeros); the ids are Marian's (</s> 0, <unk> 1), placed at ours (pad 0, unk 1, bos 2,
eos 3) with pad and bos rows of their own (zero embedding, output bias -100: never chosen).
Separate source and target vocabularies become one table, their union: a piece only the target
has embeds on the source side as the source's <unk> (what Marian's source vocabulary makes of
it), and a piece only the source has embeds as the target's <unk> and is never output.
What the model cannot represent (RNN, SSRU or average-attention decoders, pre-norm, factored
vocabularies, an untied output layer, ...) is refused in one line naming the option.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch
import yaml
from torch import Tensor

from ..config import ModelConfig
from ..data.vocab import BOS_ID, PAD_ID
from ..errors import UserError
from ..model import Transformer
from .common import ExportError
from .marian_import import (
    ACTIVATIONS,
    PAD_LOGIT_BIAS,
    Layout,
    load_marian_weights,
    model_config,
    write_imported,
)

MAX_POSITIONS = 1024  # Marian's sinusoids have no end; ours a table this long
# Options of Marian's model.yml that shape the network: what aiayn's model needs each to be
# (absent: Marian's default, which is accepted). "d" (dropout) is training-only and ignored.
REQUIRED: dict[str, tuple[Any, ...]] = {
    "type": ("transformer",),
    "transformer-decoder-autoreg": ("self-attention",),
    "transformer-preprocess": ("", "d"),
    "transformer-postprocess": ("dan", "an"),
    "transformer-postprocess-emb": ("", "d"),
    "transformer-postprocess-top": ("",),
    "transformer-ffn-depth": (2,),
    "transformer-decoder-ffn-depth": (0, 2),
    "transformer-train-position-embeddings": (False,),
    "transformer-disable-position-embeddings": (False,),
    "transformer-attention-mask": ("default",),
    "transformer-no-projection": (False,),
    "transformer-pool": (False,),
    "transformer-no-bias": (False,),
    "transformer-no-affine": (False,),
    "transformer-tied-layers": ([],),
    "right-left": (False,),
    "lemma-dim-emb": (0,),
    "ulr": (False,),
}
HINTS = {  # what a refused option means, for the one-line refusal
    "transformer-decoder-autoreg": "an RNN/SSRU or average-attention decoder",
    "transformer-preprocess": "pre-norm layers",
    "transformer-postprocess-emb": "a normalised embedding layer",
    "transformer-train-position-embeddings": "learned positions",
    "right-left": "a right-to-left model",
    "lemma-dim-emb": "a factored vocabulary",
}


def read_yaml(path: Path, loader: Any = yaml.SafeLoader) -> Any:
    """A YAML file (``SafeLoader``: plain data only); a vocabulary with ``yaml.BaseLoader``, which
    keeps every scalar a string as Marian reads it (a piece ``true`` or ``1`` stays text)."""
    if not path.is_file():
        raise ExportError(f"{path} does not exist")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (safe)
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ExportError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a Marian ``.npz``, with no pickled object allowed (nothing is executed)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as e:  # ValueError: an object array, which would need pickle
        raise ExportError(f"{path}: not a plain numpy .npz ({str(e).splitlines()[0]})") from None


def model_options(arrays: dict[str, np.ndarray], where: Path) -> dict[str, Any]:
    """The training options Marian keeps in the npz (``special:model.yml``, a byte string)."""
    raw = arrays.get("special:model.yml")
    if raw is None:
        raise ExportError(f"{where}: no special:model.yml; not a model Marian saved")
    try:
        options = yaml.safe_load(raw.tobytes().decode("utf-8").rstrip("\0"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ExportError(f"{where}: special:model.yml is not YAML ({e})") from None
    if not isinstance(options, dict):
        raise ExportError(f"{where}: special:model.yml is not a table of options")
    return options


def check_options(options: dict[str, Any], where: Path) -> None:
    """Refuse, in one line naming the option, what aiayn's Transformer cannot be."""
    for key, allowed in REQUIRED.items():
        value = options.get(key, allowed[0])
        if value is None:
            value = allowed[0]
        if value not in allowed:
            what = f" ({HINTS[key]})" if key in HINTS else ""
            raise ExportError(
                f"{where}: {key}: {value!r}{what} cannot be represented (need {allowed[0]!r})"
            )
    if options.get("transformer-ffn-activation", "swish") not in ACTIVATIONS:
        raise ExportError(
            f"{where}: transformer-ffn-activation {options['transformer-ffn-activation']!r}; "
            f"aiayn has {sorted(ACTIVATIONS)}"
        )
    ffn, dec_ffn = (
        options.get("transformer-dim-ffn", 2048),
        options.get("transformer-decoder-dim-ffn", 0),
    )
    if dec_ffn not in (0, ffn):
        raise ExportError(
            f"{where}: transformer-dim-ffn {ffn} and transformer-decoder-dim-ffn {dec_ffn} differ; aiayn has one"
        )


@dataclass(frozen=True)
class Vocabularies:
    """Marian's two tables (piece -> Marian id) and the SentencePiece models that split text."""

    source: dict[str, int]
    target: dict[str, int]
    source_spm: Path
    target_spm: Path


def read_vocabulary(path: Path) -> dict[str, int]:
    """piece -> id of a Marian vocabulary: a YAML or JSON table, or a SentencePiece model."""
    if path.suffix == ".fsv":
        raise ExportError(f"{path}: a factored vocabulary cannot be represented")
    if path.suffix == ".spm":
        try:
            model = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError):
            raise ExportError(f"{path}: not a SentencePiece model") from None
        return {model.id_to_piece(i): i for i in range(model.get_piece_size())}
    table = (
        json.loads(path.read_text(encoding="utf-8"))
        if path.suffix == ".json"
        else read_yaml(path, yaml.BaseLoader)
    )
    try:
        vocab = {str(piece): int(i) for piece, i in table.items()}
    except (AttributeError, ValueError, TypeError):
        raise ExportError(f"{path}: not a table of piece: id") from None
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ExportError(f"{path}: ids are not 0..{len(vocab) - 1} once each")
    return vocab


def find_file(directory: Path, named: str, key: str) -> Path:
    """``named`` (a path from decoder.yml's ``key``) as it lies in ``directory``: relative to it,
    or by its file name (a decoder.yml written by training names the training's own paths)."""
    for path in (directory / named, directory / Path(named).name):
        if path.is_file():
            return path
    raise ExportError(f"{directory}: decoder.yml's {key} {named} is not in the directory")


def decoder_yml(directory: Path) -> Path:
    """The directory's decoding config: ``decoder.yml``, else the one ``*.decoder.yml``."""
    if (directory / "decoder.yml").is_file():
        return directory / "decoder.yml"
    found = sorted(directory.glob("*decoder.yml"))
    if len(found) != 1:
        raise ExportError(
            f"{directory}: {'no' if not found else 'more than one'} decoder.yml; not a Marian model directory"
        )
    return found[0]


def read_directory(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any], Vocabularies]:
    """The arrays, the model options and the vocabularies that decoder.yml names."""
    config_path = decoder_yml(directory)
    config = read_yaml(config_path)
    models, vocabs = config.get("models") or [], config.get("vocabs") or []
    if len(models) != 1:
        raise ExportError(f"{config_path}: models lists {len(models)} models; aiayn imports one")
    if len(vocabs) != 2:
        raise ExportError(f"{config_path}: vocabs lists {len(vocabs)}; need source and target")
    npz = find_file(directory, models[0], "model")
    arrays = read_npz(npz)
    options = model_options(arrays, npz)
    check_options(options, npz)
    paths = [find_file(directory, v, "vocab") for v in vocabs]
    tables = [read_vocabulary(p) for p in paths]
    splitters = [
        p if p.suffix == ".spm" else directory / name
        for p, name in zip(paths, ("source.spm", "target.spm"))
    ]
    for path in splitters:
        if not path.is_file():
            raise ExportError(
                f"{path} does not exist: a YAML vocabulary needs the SentencePiece model that splits its side"
            )
    vocabs = Vocabularies(tables[0], tables[1], splitters[0], splitters[1])
    return arrays, options, vocabs


@dataclass(frozen=True)
class Joint:
    """Our table over Marian's two (module doc): the layout; for each of our ids the Marian source
    and target id whose embedding it takes (<unk>'s where that side lacks the piece) and
    whether the target has it (else it is never output)."""

    layout: Layout
    source_ids: list[int]
    target_ids: list[int]
    output: list[bool]


def joint_layout(vocabs: Vocabularies, where: Path) -> Joint:
    """Pad and bos rows of our own, Marian's <unk> and </s> at ours, then the target's pieces in
    Marian's order, then the pieces only the source has."""
    for side, table in (("source", vocabs.source), ("target", vocabs.target)):
        if "</s>" not in table or "<unk>" not in table:
            raise ExportError(f"{where}: the {side} vocabulary has no </s> or no <unk>")
    taken = set(vocabs.source) | set(vocabs.target)
    own = [p for p in ("<pad>", "<s>", "<bos>", "[pad]", "[bos]") if p not in taken][:2]
    rest = sorted(set(vocabs.target) - {"</s>", "<unk>"}, key=vocabs.target.__getitem__)
    rest += sorted(set(vocabs.source) - set(vocabs.target), key=vocabs.source.__getitem__)
    pieces = [own[0], "<unk>", own[1], "</s>", *rest]
    order = [-1 if i in (PAD_ID, BOS_ID) else i for i in range(len(pieces))]
    return Joint(
        Layout(order, pieces),
        [vocabs.source.get(p, vocabs.source["<unk>"]) for p in pieces],
        [vocabs.target.get(p, vocabs.target["<unk>"]) for p in pieces],
        [p in vocabs.target for p in pieces],
    )


def hf_names(layer: str, side: str, i: int) -> dict[str, tuple[str, bool]]:
    """Marian's tensor names of one layer -> (MarianMT name, whether to transpose)."""
    hf = f"model.{side}.layers.{i}"
    parts = {"self": "self_attn", "context": "encoder_attn"}
    names: dict[str, tuple[str, bool]] = {}
    for marian, ours in list(parts.items())[: 2 if side == "decoder" else 1]:
        for x in "qkvo":
            proj = f"{ours}.{'out' if x == 'o' else x}_proj"
            names[f"{layer}_{marian}_W{x}"] = (f"{hf}.{proj}.weight", True)
            names[f"{layer}_{marian}_b{x}"] = (f"{hf}.{proj}.bias", False)
        names[f"{layer}_{marian}_Wo_ln_scale"] = (f"{hf}.{ours}_layer_norm.weight", False)
        names[f"{layer}_{marian}_Wo_ln_bias"] = (f"{hf}.{ours}_layer_norm.bias", False)
    for j in (1, 2):
        names[f"{layer}_ffn_W{j}"] = (f"{hf}.fc{j}.weight", True)
        names[f"{layer}_ffn_b{j}"] = (f"{hf}.fc{j}.bias", False)
    names[f"{layer}_ffn_ffn_ln_scale"] = (f"{hf}.final_layer_norm.weight", False)
    names[f"{layer}_ffn_ffn_ln_bias"] = (f"{hf}.final_layer_norm.bias", False)
    return names


def embeddings(
    arrays: dict[str, np.ndarray], options: dict[str, Any], where: Path
) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) embedding matrices in Marian's ids; the target one is the output layer."""
    if "decoder_ff_logit_out_W" in arrays:
        raise ExportError(
            f"{where}: an output layer of its own (tied-embeddings: false) cannot be "
            "represented; aiayn ties it to the target embeddings"
        )
    if "Wemb" in arrays:
        return arrays["Wemb"], arrays["Wemb"]
    try:
        return arrays["encoder_Wemb"], arrays["decoder_Wemb"]
    except KeyError as e:
        raise ExportError(f"{where}: no embedding matrix {e}") from None


def tensor(value: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))


def hf_state(
    arrays: dict[str, np.ndarray], options: dict[str, Any], joint: Joint, where: Path
) -> dict[str, Tensor]:
    """The MarianMT state dict of Marian's arrays, the embeddings and output bias already in our
    ids (``load_marian_weights`` then only zeroes our own rows)."""
    source, target = embeddings(arrays, options, where)
    state = {"model.decoder.embed_tokens.weight": tensor(target[joint.target_ids])}
    key = "model.shared.weight" if source is target else "model.encoder.embed_tokens.weight"
    state[key] = tensor(source[joint.source_ids])
    bias = arrays.get("decoder_ff_logit_out_b", np.zeros(target.shape[0], np.float32))
    bias = bias.reshape(-1)[joint.target_ids]
    state["final_logits_bias"] = tensor(np.where(joint.output, bias, PAD_LOGIT_BIAS))[
        None
    ]  # (1, V)
    for side, depth in (
        ("encoder", options.get("enc-depth")),
        ("decoder", options.get("dec-depth")),
    ):
        for i in range(depth or 0):
            for name, (hf, transpose) in hf_names(f"{side}_l{i + 1}", side, i).items():
                if name not in arrays:
                    raise ExportError(f"{where}: no tensor {name} ({side} depth {depth})")
                state[hf] = tensor(arrays[name].T if transpose else arrays[name].reshape(-1))
    return state


def npz_config(options: dict[str, Any], vocab_size: int, shared: bool) -> ModelConfig:
    """Our ModelConfig of Marian's options (``marian_import.model_config`` through its names)."""
    hf = {
        "encoder_layers": options.get("enc-depth"),
        "decoder_layers": options.get("dec-depth"),
        "d_model": options.get("dim-emb"),
        "encoder_ffn_dim": options.get("transformer-dim-ffn", 2048),
        "encoder_attention_heads": options.get("transformer-heads", 8),
        "dropout": options.get("transformer-dropout", 0.0),
        "attention_dropout": options.get("transformer-dropout-attention", 0.0),
        "max_position_embeddings": MAX_POSITIONS,
        "activation_function": options.get("transformer-ffn-activation", "swish"),
        "share_encoder_decoder_embeddings": shared,
    }
    try:
        return replace(
            model_config(hf, vocab_size, output_bias=True), positional="marian", norm_eps=1e-9
        )
    except (TypeError, UserError) as e:  # a missing or impossible size
        raise ExportError(f"special:model.yml: {e}") from None


def npz_to_transformer(directory: Path) -> tuple[Transformer, Layout, Vocabularies]:
    """The Transformer (eval mode, CPU) of Marian model ``directory``, its layout and vocabularies."""
    arrays, options, vocabs = read_directory(directory)
    joint = joint_layout(vocabs, directory)
    state = hf_state(arrays, options, joint, directory)
    shared = "model.shared.weight" in state
    model = Transformer(npz_config(options, len(joint.layout.pieces), shared))
    with torch.no_grad():
        load_marian_weights(model, state, joint.layout)
    return model.eval(), joint.layout, vocabs


def import_marian_npz(directory: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write Marian model ``directory`` as the checkpoint directory ``out`` (must not exist),
    with decoder.yml's beam size and length normalisation as its defaults under marian rules."""
    directory = Path(directory)
    model, layout, vocabs = npz_to_transformer(directory)
    spms = (vocabs.source_spm, vocabs.target_spm)
    own = decoding_defaults(read_yaml(decoder_yml(directory)) or {})
    defaults = {"marian": own} if own else None
    return write_imported(
        model, layout.pieces, spms, directory, Path(out), search_defaults=defaults
    )


def decoding_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """decoder.yml's ``beam-size`` and ``normalize`` as the search's ``beam`` and ``alpha``
    (what ``marian-decoder -c decoder.yml`` searches with); a value of another type is left."""
    own: dict[str, Any] = {}
    beam, normalize = config.get("beam-size"), config.get("normalize")
    if isinstance(beam, int) and not isinstance(beam, bool) and beam >= 1:
        own["beam"] = beam
    if isinstance(normalize, int | float) and not isinstance(normalize, bool) and normalize >= 0:
        own["alpha"] = float(normalize)
    return own


def is_marian_npz(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is Marian's own format (a decoder.yml, no MarianMT config.json)."""
    directory = Path(directory)
    return not (directory / "config.json").is_file() and any(directory.glob("*decoder.yml"))
