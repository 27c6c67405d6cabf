"""What a run may start from another run's checkpoint (``init_from``, fine-tuning): the same
vocabulary and the same model, dropout aside, and never a checkpoint inside its own OUT,
which it would then write into."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import checkpoint as ckpt
from ..config import ModelConfig, from_dict
from ..data.pieces import AnyVocab
from ..errors import UserError

FINE_TUNABLE = {"P_drop", "attention_dropout"}  # model keys a fine-tuning run may change


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
