"""Checkpoints: safetensors weights + JSON metadata + trainer state, written atomically.

A checkpoint is a directory ``<run>/checkpoints/update_0001234/`` holding

- ``model.safetensors``: the weights (the tied embedding stored once),
- ``meta.json``: resolved configs, update count, data position, elapsed time, validation,
- ``trainer.pt``: optimizer, scheduler, grad-scaler and RNG states (loaded with
  ``weights_only=True``: nothing in a checkpoint can execute code),
- ``spm.model``: the vocabulary, so that a checkpoint translates raw text on its own.

It is built in a temporary directory, every file fsynced, then renamed into place; the
``latest`` pointer is replaced atomically afterwards. A crash at any moment leaves the
previous latest checkpoint intact; the next save removes what a killed save left.
"""

from __future__ import annotations

import errno
import json
import pickle
import re
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from .config import ModelConfig, from_dict
from .data.vocab import Vocab
from .errors import UserError
from .io import publish_dir, remove_leftovers, temp_dir_beside, write_text_atomic
from .model import Transformer

WEIGHTS, META, TRAINER, VOCAB = "model.safetensors", "meta.json", "trainer.pt", "spm.model"
CHECKPOINT_NAME = re.compile(r"update_\d+")


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
) -> Path:
    """Write checkpoint ``update`` under ``ckpt_root`` atomically; prune to ``keep_last``.

    A full disk removes the partial temporary directory and says so: the previous checkpoint
    and ``latest`` stay as they were, and training resumes from them once there is space.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / checkpoint_name(update)
    remove_leftovers(ckpt_root)  # half-written checkpoints of killed runs, any update
    tmp = temp_dir_beside(final)
    try:
        save_model(model, str(tmp / WEIGHTS))  # de-duplicates the tied matrix
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER)
        if vocab_file is not None:
            shutil.copyfile(vocab_file, tmp / VOCAB)
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
    write_text_atomic(ckpt_root / "latest", final.name + "\n")
    if keep_last is not None:
        for old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories and links are ignored)."""
    if not ckpt_root.is_dir():
        return []
    return sorted(
        p
        for p in ckpt_root.iterdir()
        if CHECKPOINT_NAME.fullmatch(p.name) and not p.is_symlink() and (p / META).is_file()
    )


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint named by ``ckpt_root/latest``, else the newest complete one.

    The pointer may only name a checkpoint directory inside ``ckpt_root``: a pointer to
    another place (``../x``, an absolute path, a link) is refused rather than followed, so
    that training never resumes from, and pruning never deletes, what is not this run's.
    """
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
        path = ckpt_root / name
        if not CHECKPOINT_NAME.fullmatch(name) or path.is_symlink():
            raise UserError(
                f"{pointer} names {name!r}, which is not a checkpoint directory inside "
                f"{ckpt_root}; delete {pointer} to resume from the newest checkpoint there"
            )
        if (path / META).is_file():
            return path
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / META
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {META} is missing")
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
        return torch.load(path, map_location="cpu", weights_only=True)
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
    except RuntimeError as e:
        raise UserError(
            f"{path}: unreadable ({str(e).splitlines()[0]}): the checkpoint is damaged"
        ) from None


def load_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's ``model.safetensors`` (a damaged file is named as such)."""
    path = Path(ckpt) / WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {WEIGHTS} is missing")
    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise UserError(
            f"{path}: not a readable safetensors file ({e}): the checkpoint is damaged (truncated?)"
        ) from None


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


def load_transformer(ckpt: str | Path, device: str | torch.device = "cpu"):
    """(Transformer in eval mode, its ModelConfig) from a checkpoint or averaged directory."""
    meta = read_meta(Path(ckpt))
    cfg = from_dict(
        ModelConfig,
        meta_field(meta, "model_config", Path(ckpt)),
        where=f"{ckpt}/{META} model_config",
    )
    model = Transformer(cfg)
    load_weights(model, Path(ckpt))
    return model.to(device).eval(), cfg


# ----------------------------------------------------------------------------------------
# Averaging (section 6.1)


def is_averaged_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a directory ``average_checkpoints`` wrote, holding nothing else."""
    if path.is_symlink() or not path.is_dir():
        return False
    if any(p.name not in (WEIGHTS, META, VOCAB) for p in path.iterdir()):
        return False
    try:
        return "averaged_from" in read_meta(path)
    except ValueError:
        return False


def check_average_out(out: Path, inputs: Sequence[Path], force: bool = False) -> None:
    """Refuse an output directory whose replacement would destroy what averaging did not write.

    Never a directory that holds (or is) one of the inputs (a run or checkpoints directory),
    even with ``force``; an existing path only if it is a previous averaged checkpoint, or
    with ``force``.
    """
    target = Path(out).resolve()
    for p in inputs:
        source = Path(p).resolve()
        if source == target or target in source.parents:
            raise UserError(
                f"--out {out} holds the checkpoint {p} being averaged; choose a new directory"
            )
    if (out.exists() or out.is_symlink()) and not force and not is_averaged_checkpoint(out):
        raise UserError(
            f"--out {out} exists and is not an averaged checkpoint; choose a new directory, "
            "or pass --force to replace it"
        )


def vocab_fingerprint(ckpt: Path) -> str | None:
    """The fingerprint of a checkpoint's own ``spm.model`` (what translation will use); the
    one in meta.json when the checkpoint carries no vocabulary file."""
    vocab_file = Path(ckpt) / VOCAB
    if vocab_file.is_file():
        return Vocab.load(vocab_file).fingerprint
    return read_meta(Path(ckpt)).get("vocab_fingerprint")


def check_same_model(paths: Sequence[Path]) -> None:
    """Averaging weights means something only for one model config and one vocabulary."""
    first, first_meta = Path(paths[0]), read_meta(Path(paths[0]))
    first_vocab = vocab_fingerprint(first)
    for p in paths[1:]:
        meta = read_meta(Path(p))
        if meta.get("model_config") != first_meta.get("model_config"):
            raise UserError(f"{p} and {first} have different model configs: cannot average them")
        if vocab_fingerprint(Path(p)) != first_vocab:
            raise UserError(
                f"{p} and {first} have different vocabularies ({VOCAB}): cannot average them"
            )


def average_checkpoints(paths: Sequence[Path], out: Path, force: bool = False) -> Path:
    """Average the weights of ``paths`` into checkpoint directory ``out`` (section 6.1).

    Floating-point tensors are accumulated in float32 and cast back; other tensors (none in
    this model, but e.g. integer buffers) are taken from the last checkpoint. The tied matrix
    is stored once per file, so it is averaged once and stays tied when loaded. ``out`` is
    built in a new temporary directory and renamed into place; see ``check_average_out`` for
    what it may replace.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    out = Path(out)
    check_average_out(out, paths, force)
    check_same_model(paths)
    states = [load_state(Path(p)) for p in paths]
    names = set(states[0])
    for p, state in zip(paths, states):
        if set(state) != names:
            raise UserError(f"{p} holds different tensors than {paths[0]}: cannot average")
    averaged: dict[str, torch.Tensor] = {}
    for name in sorted(names):
        last = states[-1][name]
        if last.is_floating_point():
            total = torch.zeros_like(last, dtype=torch.float32)
            for state in states:
                total += state[name].float()
            averaged[name] = (total / len(states)).to(last.dtype)
        else:
            averaged[name] = last.clone()
    tmp = temp_dir_beside(out)
    try:
        save_file(
            averaged,
            str(tmp / WEIGHTS),
            metadata={"averaged_from": json.dumps([str(p) for p in paths])},
        )
        meta = read_meta(Path(paths[-1]))
        meta["averaged_from"] = [Path(p).name for p in paths]
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if (Path(paths[-1]) / VOCAB).exists():
            shutil.copyfile(Path(paths[-1]) / VOCAB, tmp / VOCAB)
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when published
    return out


def choose_last(ckpt_root: Path, last: int) -> list[Path]:
    """The newest ``last`` complete checkpoints under ``ckpt_root``, oldest first; warns when
    fewer exist (``keep_last`` in training bounds how many are kept)."""
    if last < 1:
        raise UserError(f"--last must be at least 1, got {last}")
    found = list_checkpoints(Path(ckpt_root))
    if not found:
        raise UserError(f"no checkpoints under {ckpt_root}")
    if len(found) < last:
        warnings.warn(
            f"asked for the last {last} checkpoints, but {ckpt_root} holds only {len(found)}: "
            f"averaging {len(found)} (the run's keep_last bounds how many are kept)",
            stacklevel=2,
        )
    return found[-last:]
