"""Checkpoints: safetensors weights + JSON metadata + trainer state, written atomically.

A checkpoint is a directory ``<run>/checkpoints/update_0001234/`` holding

- ``model.safetensors``: the weights (the tied embedding stored once),
- ``meta.json``: resolved configs, update count, data position, elapsed time, validation,
- ``trainer.pt``: optimizer, scheduler, grad-scaler and RNG states (loaded with
  ``weights_only=True``: nothing in a checkpoint can execute code),
- ``spm.model``: the vocabulary, so that a checkpoint translates raw text on its own (an
  imported MarianMT model: ``source.spm``, ``target.spm`` and ``pieces.json``, ``data.pieces``),
- ``SHA256SUMS``: the digests of the weights and trainer state, checked when they load
  (``checkpoint.digest``: safetensors has no checksum of its own),
- ``ema/`` (training with ``ema_decay``): the moving average of the weights, a checkpoint
  directory of its own (weights, meta.json, vocabulary) that every command reads as any other.

It is built in a temporary directory, every file fsynced, then renamed into place; the
``latest`` pointer (and ``best``, when the checkpoint has the best validation so far) is
replaced atomically afterwards. A crash at any moment leaves the previous latest checkpoint
intact; the next save removes what a killed save left. ``keep_last`` never prunes the
checkpoint ``best`` names.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file
from torch import nn

from ..config import ModelConfig, from_dict
from ..data.pieces import (
    AnyVocab,
    copy_vocabulary,
    load_vocabulary,
    vocabulary_file,
)
from ..errors import UserError
from ..files import (
    fsync_tree,
    publish_dir,
    remove_leftovers,
    temp_dir_beside,
    write_text_atomic,
)
from ..model import Transformer
from .digest import check_digest, write_digests

WEIGHTS, META, TRAINER, VOCAB = "model.safetensors", "meta.json", "trainer.pt", "spm.model"
LATEST, BEST = "latest", "best"  # pointer files in a run's checkpoints/
EMA_DIR = "ema"  # in a checkpoint: the moving average of its weights, as a checkpoint
# The validation metrics a run may select checkpoints by, and whether lower is better.
LOWER_IS_BETTER = {"valid_ppl": True, "valid_bleu": False}
CHECKPOINT_NAME = re.compile(r"update_\d+")


def checkpoint_files(ckpt: Path) -> list[Path]:
    """The files of checkpoint directory ``ckpt`` that commands read (present or not)."""
    return [Path(ckpt) / name for name in (WEIGHTS, META, TRAINER, VOCAB)]


def checkpoint_name(update: int) -> str:
    return f"update_{update:07d}"


def save_checkpoint(
    ckpt_root: Path,
    update: int,
    model: nn.Module,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None,
    vocab_file: Path | None,
    keep_last: int | None = None,
    best: bool = False,
    ema: nn.Module | None = None,
) -> Path:
    """Write checkpoint ``update`` under ``ckpt_root`` atomically, with the averaged weights
    ``ema`` in ``ema/``; point ``best`` at it when ``best``; prune to the ``keep_last``
    newest and the best.

    A full disk removes the partial temporary directory and says so: the previous checkpoint
    and ``latest`` stay as they were, and training resumes from them once there is space.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / checkpoint_name(update)
    remove_leftovers(ckpt_root)  # half-written checkpoints of killed runs, any update
    tmp = temp_dir_beside(final)
    try:
        save_weights(model, tmp / WEIGHTS)
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER)
        if vocab_file is not None:
            copy_vocabulary(vocab_file, tmp)
        if ema is not None:
            _write_ema(tmp / EMA_DIR, ema, {**meta, "ema_of": final.name}, vocab_file)
        write_digests(tmp, [WEIGHTS, TRAINER])
        publish_dir(tmp, final)  # replaces the same update written again after a resume
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno == errno.ENOSPC:
            previous = latest_checkpoint(ckpt_root)
            raise OSError(
                errno.ENOSPC,
                f"no space left on device while saving checkpoint {final}: the partial "
                f"{tmp.name} was removed; the latest complete checkpoint is "
                f"{previous or 'none'}. Free space, then train again to resume",
            ) from None
        raise
    write_text_atomic(ckpt_root / LATEST, final.name + "\n")
    if best:
        write_text_atomic(ckpt_root / BEST, final.name + "\n")
    if keep_last is not None:
        kept = best_checkpoint(ckpt_root)
        for old in list_checkpoints(ckpt_root)[:-keep_last]:
            if old != kept:
                shutil.rmtree(old)
    return final


def save_weights(model: nn.Module, path: Path) -> None:
    """The model's tensors as safetensors, a shared (tied) matrix once, under the first of its
    names in sorted order, as ``safetensors.torch.save_model`` stores it; its other names go under
    one metadata key, because safetensors writes several keys in a random order and a file's bytes
    should follow its tensors alone (``sha256sum`` then checks a reproduction)."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first_name: dict[int, str] = {}
    for name, tensor in sorted(model.state_dict().items()):
        key = tensor.untyped_storage().data_ptr()
        if key in first_name:
            aliases[name] = first_name[key]
        else:
            first_name[key] = name
            kept[name] = tensor.detach().contiguous()
    save_file(kept, str(path), metadata={"aliases": json.dumps(aliases, sort_keys=True)})


def _write_ema(
    directory: Path, model: nn.Module, meta: dict[str, Any], vocab_file: Path | None
) -> None:
    directory.mkdir()
    save_weights(model, directory / WEIGHTS)
    (directory / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    if vocab_file is not None:
        copy_vocabulary(vocab_file, directory)
    write_digests(directory, [WEIGHTS])
    fsync_tree(directory)  # publish_dir syncs the files of the checkpoint, not of its folders


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories and links are ignored)."""
    if not ckpt_root.is_dir():
        return []
    return sorted(
        p
        for p in ckpt_root.iterdir()
        if CHECKPOINT_NAME.fullmatch(p.name) and not p.is_symlink() and (p / META).is_file()
    )


def _pointed_at(ckpt_root: Path, pointer_name: str, remedy: str) -> Path | None:
    """The complete checkpoint that pointer file ``ckpt_root/pointer_name`` names, if any.

    The pointer may only name a checkpoint directory inside ``ckpt_root``: a pointer to
    another place (``../x``, an absolute path, a link) is refused rather than followed, so
    that training never resumes from, and pruning never deletes, what is not this run's.
    """
    pointer = ckpt_root / pointer_name
    if not pointer.is_file():
        return None
    with open(pointer, "rb") as f:  # a name is short: never read a whole stray file
        name = f.read(256).decode("utf-8", errors="replace").strip()
    path = ckpt_root / name
    if not CHECKPOINT_NAME.fullmatch(name) or path.is_symlink():
        quoted = repr(name[:60]) + (" ..." if len(name) > 60 else "")
        raise UserError(
            f"{pointer} names {quoted}, which is not a checkpoint directory inside "
            f"{ckpt_root}; delete {pointer} {remedy}"
        )
    return path if (path / META).is_file() else None


def follow_pointer(path: str | os.PathLike) -> Path:
    """``path``, or the checkpoint it names when it is a run's ``latest`` or ``best`` pointer
    file (``OUT/checkpoints/latest``), so that a command takes either; ``UserError`` when the
    pointer names no complete checkpoint."""
    path = Path(path)
    if path.name not in (LATEST, BEST) or not path.is_file():
        return path
    again = "checkpoint" if path.name == LATEST else "better validation"
    remedy = f"(the next {again} writes it again)"
    found = _pointed_at(path.parent, path.name, remedy)
    if found is None:
        raise UserError(f"{path} names no complete checkpoint inside {path.parent}")
    return found


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint named by ``ckpt_root/latest``, else the newest complete one."""
    path = _pointed_at(ckpt_root, LATEST, "to resume from the newest checkpoint there")
    if path is not None:
        return path
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def best_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint named by ``ckpt_root/best``: the best validation ``best_metric`` of
    its run so far (None before the first validation, or without validation)."""
    return _pointed_at(ckpt_root, BEST, "(the next better validation writes it again)")


def _hint(path: Path) -> str:
    """For a run directory or its ``checkpoints/`` given as a checkpoint: which to give."""
    for root in (path / "checkpoints", path):
        if root.is_dir() and (found := latest_checkpoint(root)) is not None:
            return f"; {path} holds a run's checkpoints: give {root / LATEST} (now {found.name})"
    return ""


def recorded_language(ckpt: str | Path, side: str) -> str | None:
    """The language ``aiayn prepare`` recorded for ``side`` ("src" or "tgt") of the data the
    checkpoint trained on (training copies the dataset's meta.json into every checkpoint);
    None when it records none."""
    record = read_meta(Path(ckpt)).get("dataset", {}).get("record") or {}
    lang = record.get(f"{side}_lang")
    return str(lang) if lang else None


def search_defaults(ckpt: str | Path) -> dict[str, Any]:
    """The checkpoint's own search settings per rules (``meta.json``'s ``search_defaults``:
    an imported OPUS-MT model's generation settings under "hf"); {} when it records none, or
    when ``ckpt`` is no checkpoint (loading it says so)."""
    path = follow_pointer(ckpt)
    if not (path / META).is_file():
        return {}
    recorded = read_meta(path).get("search_defaults") or {}
    return recorded if isinstance(recorded, dict) else {}


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / META
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {META} is missing{_hint(Path(ckpt))}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: invalid UTF-8 at byte {e.start}: the checkpoint is damaged"
        ) from None
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}: line {e.lineno}: invalid JSON ({e.msg}): the checkpoint is damaged"
        ) from None
    if not isinstance(meta, dict):
        raise UserError(
            f"{path}: expected a JSON object, found {type(meta).__name__}: the checkpoint is damaged"
        )
    return meta


def meta_field(meta: dict[str, Any], key: str, ckpt: Path) -> Any:
    """``meta[key]``, or an error naming the checkpoint's meta.json and the missing key."""
    if key not in meta:
        raise UserError(
            f"{Path(ckpt) / META}: no {key!r} entry: not a checkpoint written by aiayn train"
        )
    return meta[key]


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """Optimizer, scheduler, scaler and RNG states; tensors and plain data only.

    ``weights_only=True`` refuses any pickled object that would run code when loaded; such a
    file (or a damaged one) is reported as untrusted, never loaded another way.
    """
    path = Path(ckpt) / TRAINER
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        detail = next(
            (
                line.strip()
                for line in str(e).splitlines()
                if "global" in line.lower() and "weights_only" not in line
            ),
            "",
        )
        raise UserError(
            f"{path}: not a trusted checkpoint: it holds objects other than tensors and plain "
            f"data, which aiayn never loads{f' ({detail})' if detail else ''}"
        ) from None
    # what the unpickler raises on bytes that are no pickle: the file is damaged, not our code
    except (RuntimeError, KeyError, IndexError, ValueError, EOFError, TypeError) as e:
        detail = " ".join([type(e).__name__, *str(e).splitlines()[:1]])
        raise UserError(f"{path}: unreadable ({detail}): the checkpoint is damaged") from None
    check_digest(path)  # bytes changed inside a tensor load without an error
    return state


def check_finite(tensors: Mapping[str, torch.Tensor], ckpt: Path) -> None:
    """Refuse NaN or infinite weights (a diverged run): they decode every line to an empty
    one and export without a word. The first bad tensor is named."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(
                f"{ckpt}: {name} holds NaN or infinite values: the run diverged before this "
                "checkpoint; use an earlier one"
            )


def load_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's ``model.safetensors`` (a damaged file is named as such)."""
    path = Path(ckpt) / WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {WEIGHTS} is missing")
    try:
        state = load_file(str(path))
    except SafetensorError as e:
        raise UserError(
            f"{path}: not a readable safetensors file ({e}): the checkpoint is damaged (truncated?)"
        ) from None
    check_digest(path)  # bytes changed inside a tensor load without an error
    check_finite(state, ckpt)
    return state


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load ``model.safetensors`` into ``model`` (tied parameters are filled once, stay tied)."""
    path = Path(ckpt) / WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {WEIGHTS} is missing")
    try:
        missing, unexpected = load_model(model, str(path), strict=True)
    except SafetensorError as e:
        raise UserError(
            f"{path}: not a readable safetensors file ({e}): the checkpoint is damaged (truncated?)"
        ) from None
    except RuntimeError as e:  # shapes that do not fit the model config in meta.json
        raise UserError(
            f"{path}: weights do not fit the model of {META}: {str(e).splitlines()[-1].strip()}"
        ) from None
    if missing or unexpected:
        raise UserError(
            f"{ckpt}: weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    check_digest(path)  # bytes changed inside a tensor load without an error
    check_finite(model.state_dict(), ckpt)


def load_transformer(ckpt: str | Path, device: str | torch.device = "cpu"):
    """(Transformer in eval mode, its ModelConfig) from a checkpoint or averaged directory: the
    weights and nothing else; whoever decodes with it makes it ready (``runtime.for_decoding``)."""
    meta = read_meta(Path(ckpt))
    cfg = from_dict(
        ModelConfig,
        meta_field(meta, "model_config", Path(ckpt)),
        where=f"{ckpt}/{META} model_config",
    )
    model = Transformer(cfg)  # the paper's kernels: a decoding model gets its own (runtime)
    load_weights(model, Path(ckpt))
    return model.to(device).eval(), cfg


def load_translator(
    ckpt: str | Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, AnyVocab]:
    """(Transformer in eval mode, its vocabulary) of a checkpoint or averaged directory: the
    model and the ``spm.model`` (or two models, ``load_vocab``) beside it, which must have the
    model's vocabulary size."""
    model, cfg = load_transformer(ckpt, device)
    vocab = load_vocab(ckpt)
    if len(vocab) != cfg.vocab_size:
        raise UserError(
            f"{vocab.path} has {len(vocab)} pieces, the model's vocab_size is {cfg.vocab_size}"
        )
    return model, vocab


def load_vocab(ckpt: str | Path) -> AnyVocab:
    """The vocabulary a checkpoint's ids are in, whatever decodes them: its ``spm.model``, or
    the two models of an imported one (``data.pieces``)."""
    path = vocabulary_file(Path(ckpt))
    if path is None:
        raise UserError(f"{ckpt}: no {VOCAB}; decoding needs the checkpoint's vocabulary")
    return load_vocabulary(path)


def vocab_fingerprint(ckpt: Path) -> str | None:
    """The fingerprint of a checkpoint's own vocabulary (what translation will use); the
    one in meta.json when the checkpoint carries no vocabulary file."""
    vocab_file = vocabulary_file(Path(ckpt))
    if vocab_file is not None:
        return load_vocabulary(vocab_file).fingerprint
    return read_meta(Path(ckpt)).get("vocab_fingerprint")
