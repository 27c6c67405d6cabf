"""Checkpoints: safetensors weights + JSON metadata + trainer state, written atomically.

A checkpoint is a directory ``<run>/checkpoints/update_0001234/`` holding

- ``model.safetensors``: the weights (the tied embedding stored once),
- ``meta.json``: resolved configs, update count, data position, elapsed time, validation,
- ``trainer.pt``: optimizer, scheduler, grad-scaler and RNG states (loaded with
  ``weights_only=True``: nothing in a checkpoint can execute code),
- ``spm.model``: the vocabulary, so that a checkpoint translates raw text on its own.

It is built in a temporary directory, every file fsynced, then renamed into place; the
``latest`` pointer is replaced atomically afterwards. A crash at any moment leaves the
previous latest checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from .config import ModelConfig, from_dict
from .model import Transformer

WEIGHTS, META, TRAINER, VOCAB = "model.safetensors", "meta.json", "trainer.pt", "spm.model"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
    """Write checkpoint ``update`` under ``ckpt_root`` atomically; prune to ``keep_last``."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / checkpoint_name(update)
    tmp = ckpt_root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / WEIGHTS))  # de-duplicates the tied matrix
    (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER)
    if vocab_file is not None:
        shutil.copyfile(vocab_file, tmp / VOCAB)
    for file in tmp.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # the same update written again after a resume
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_root)
    write_text_atomic(ckpt_root / "latest", final.name + "\n")
    if keep_last is not None:
        for old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories are ignored)."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir()
                  if p.is_dir() and p.name.startswith("update_") and (p / META).exists())


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    pointer = ckpt_root / "latest"
    if pointer.exists():
        path = ckpt_root / pointer.read_text(encoding="utf-8").strip()
        if (path / META).exists():
            return path
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / META
    if not path.exists():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint: {META} is missing")
    return json.loads(path.read_text(encoding="utf-8"))


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(Path(ckpt) / TRAINER, map_location="cpu", weights_only=True)


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load ``model.safetensors`` into ``model`` (tied parameters are filled once, stay tied)."""
    missing, unexpected = load_model(model, str(Path(ckpt) / WEIGHTS), strict=True)
    if missing or unexpected:
        raise ValueError(f"{ckpt}: weights do not fit the model: missing {missing}, unexpected {unexpected}")


def load_transformer(ckpt: str | Path, device: str | torch.device = "cpu"):
    """(Transformer in eval mode, its ModelConfig) from a checkpoint or averaged directory."""
    meta = read_meta(Path(ckpt))
    cfg = from_dict(ModelConfig, meta["model_config"], where=f"{ckpt}/{META} model_config")
    model = Transformer(cfg)
    load_weights(model, Path(ckpt))
    return model.to(device).eval(), cfg


def average_checkpoints(paths: Sequence[Path], out: Path) -> Path:
    """Average the weights of ``paths`` into checkpoint directory ``out`` (section 6.1).

    Floating-point tensors are accumulated in float32 and cast back; other tensors (none in
    this model, but e.g. integer buffers) are taken from the last checkpoint. The tied matrix
    is stored once per file, so it is averaged once and stays tied when loaded.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [load_file(str(Path(p) / WEIGHTS)) for p in paths]
    names = set(states[0])
    for p, state in zip(paths, states):
        if set(state) != names:
            raise ValueError(f"{p} holds different tensors than {paths[0]}: cannot average")
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
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(averaged, str(tmp / WEIGHTS), metadata={"averaged_from": json.dumps([str(p) for p in paths])})
    meta = read_meta(Path(paths[-1]))
    meta["averaged_from"] = [Path(p).name for p in paths]
    (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    if (Path(paths[-1]) / VOCAB).exists():
        shutil.copyfile(Path(paths[-1]) / VOCAB, tmp / VOCAB)
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return out
