"""What a run may start from another run's checkpoint (``init_from``, fine-tuning): the same
vocabulary and the same model, dropout aside, and never a checkpoint inside its own OUT,
which it would then write into. The model is the checkpoint's (``start_model``): a fine-tuning
config names its data, out and schedule, and a model section only to change dropout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import checkpoint as ckpt
from ..config import ModelConfig, from_dict
from ..data.pieces import AnyVocab
from ..errors import UserError
from .config import TrainConfig

FINE_TUNABLE = {"P_drop", "attention_dropout"}  # model keys a fine-tuning run may change


def saved_model(path: Path) -> ModelConfig:
    """The model config checkpoint ``path`` records (a key older checkpoints lack: its default)."""
    where = f"init_from {path}"
    meta = ckpt.read_meta(path)
    return from_dict(ModelConfig, ckpt.meta_field(meta, "model_config", path), where=where)


def start_model(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The run's model: the config's (preset and model keys) for a new run; with ``init_from``
    the checkpoint's, with the config's dropout keys over it. A preset or model key that
    says otherwise than the checkpoint is refused in one line naming it."""
    path = Path(cfg.init_from or "")
    if (
        not cfg.init_from or not (path / ckpt.META).is_file()
    ):  # none, or no checkpoint: resuming or check_init_from says so
        return cfg.model_config(vocab_size=vocab_size)
    saved = saved_model(path)
    named = dict(cfg.model)
    if cfg.preset != TrainConfig.preset:  # a preset named: its fields, under the model keys
        preset = dataclasses.asdict(ModelConfig.preset(cfg.preset))
        named = {**{k: v for k, v in preset.items() if k != "vocab_size"}, **named}
    has = dataclasses.asdict(saved)
    differ = sorted(k for k in named.keys() - FINE_TUNABLE if named[k] != has.get(k))
    if differ:
        shown = ", ".join(f"{k}: {has.get(k)} there, {named[k]} here" for k in differ)
        raise UserError(
            f"init_from {path}: the config's model says otherwise ({shown}); a fine-tuning run "
            "takes its model from the checkpoint: leave the preset and model section out "
            "(only dropout may change)"
        )
    return dataclasses.replace(saved, **{k: named[k] for k in FINE_TUNABLE & named.keys()})


def check_outside(path: Path, out: Path) -> None:
    if out.resolve() in (path.resolve(), *path.resolve().parents):
        raise UserError(
            f"init_from {path} is inside out={out}: fine-tune into another out, "
            "which never writes into the run it starts from"
        )


def check_init_from(
    path: Path, *, out: Path, vocab: AnyVocab, model_cfg: ModelConfig, keep: list[str]
) -> None:
    """Refuse, in one line naming what differs, a checkpoint this run cannot start from."""
    where = f"init_from {path}"
    check_outside(path, out)
    meta = ckpt.read_meta(path)
    if ckpt.vocab_fingerprint(path) != vocab.fingerprint:
        raise UserError(
            f"{where} has another vocabulary than {vocab.path}: binarise the new text "
            f"with the checkpoint's (aiayn prepare --vocab {path} ...)"
        )
    # through ModelConfig: a key older checkpoints lack has its default (the paper's)
    saved = dataclasses.asdict(
        from_dict(ModelConfig, ckpt.meta_field(meta, "model_config", path), where=where)
    )
    now = dataclasses.asdict(model_cfg)
    differ = sorted(k for k in now.keys() - FINE_TUNABLE if saved.get(k) != now[k])
    if differ:
        shown = ", ".join(f"{k}: {saved.get(k)} there, {now[k]} here" for k in differ)
        raise UserError(f"{where}: another model ({shown}); only dropout may change")
    if keep and not (path / ckpt.TRAINER).is_file():
        raise UserError(
            f"{where} holds no trainer state ({ckpt.TRAINER}) to keep {', '.join(keep)} "
            "from: an averaged or moving-average checkpoint"
        )
