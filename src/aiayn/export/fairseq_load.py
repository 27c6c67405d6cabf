"""A fairseq checkpoint's parts, read without executing code: the weights, the model's options
(``args``, or ``cfg["model"]``), the source and target languages, and fairseq's dictionaries.

A fairseq ``.pt`` is a torch pickle that holds its configuration as objects: an
``argparse.Namespace`` (``args``, or ``cfg["model"]`` where fairseq 0.12 keeps the model's
legacy options) and, from some versions, omegaconf containers. It is read with
``torch.load(weights_only=True)`` and an allowlist of those few classes, each mapped to an inert
stand-in that only stores what the pickle gives it, and numpy's number scalars (a training
metric): anything else the pickle names (a planted ``os.system``) is refused in one line and
nothing is executed.

A fairseq ``Dictionary`` (``dict.LANG.txt``) numbers ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
``<unk>`` 3, then the file's words in their order (``word count`` a line, fairseq-preprocess's
``madeupword`` fillers included).
"""

from __future__ import annotations

import argparse
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import scalar
from torch import Tensor

from .common import ExportError

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary: ids 0..3
BOS, PAD, EOS, UNK = range(4)
CHECKPOINT_NAMES = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")


class Inert:
    """A stand-in for a configuration class a fairseq pickle names (an omegaconf container):
    it keeps the state the pickle sets and runs nothing of the class it stands for."""

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


# The only globals a fairseq checkpoint may name: its options' containers (inert stand-ins).
OMEGACONF = (
    "omegaconf.dictconfig.DictConfig",
    "omegaconf.listconfig.ListConfig",
    "omegaconf.base.ContainerMetadata",
    "omegaconf.base.Metadata",
    "omegaconf.nodes.AnyNode",
    "omegaconf.nodes.StringNode",
    "omegaconf.nodes.IntegerNode",
    "omegaconf.nodes.FloatNode",
    "omegaconf.nodes.BooleanNode",
    "omegaconf.nodes.EnumNode",
)
# numpy's scalars (a training metric saved as np.float64): a dtype and its bytes, no code
NUMBERS = [type(np.dtype(t)) for t in ("bool", "int32", "int64", "float16", "float32", "float64")]
ALLOWED: list[Any] = [
    argparse.Namespace,
    *[(Inert, name) for name in OMEGACONF],
    np.dtype,
    *NUMBERS,
    (scalar, "numpy.core.multiarray.scalar"),  # numpy 1's name
    (scalar, "numpy._core.multiarray.scalar"),  # numpy 2's
]


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's top-level dict, loaded weights-only with ``ALLOWED`` (module doc)."""
    if not path.is_file():
        raise ExportError(f"{path} does not exist")
    try:
        with torch.serialization.safe_globals(ALLOWED):
            found = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = named.group(1) if named else str(e).strip().splitlines()[-1]
        raise ExportError(
            f"{path}: refused: the pickle names {what}, not one of the classes a fairseq "
            "checkpoint needs (nothing was executed)"
        ) from None
    # what the unpickler raises on bytes that are no pickle: another kind of file, or damaged
    except (RuntimeError, OSError, EOFError, KeyError, IndexError, ValueError, TypeError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExportError(f"{path}: not a torch checkpoint ({detail})") from None
    if not isinstance(found, dict) or not isinstance(found.get("model"), dict):
        raise ExportError(f"{path}: no 'model' state dict; not a fairseq checkpoint")
    return found


def plain(value: Any) -> Any:
    """Options as plain data: a Namespace's or a stand-in omegaconf container's contents."""
    if isinstance(value, argparse.Namespace):
        return {k: plain(v) for k, v in vars(value).items()}
    if isinstance(value, Inert):
        state = getattr(value, "state", None)  # None: the pickle set no state
        state = state if isinstance(state, dict) else {}
        content = state.get("_content", state.get("_val"))
        return plain(content)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def model_options(checkpoint: dict[str, Any], where: Path) -> dict[str, Any]:
    """The model's options: ``args`` (fairseq before 0.10), else ``cfg["model"]``; with the
    task's ``source_lang`` / ``target_lang`` where the model's options lack them."""
    args, cfg = plain(checkpoint.get("args")), plain(checkpoint.get("cfg"))
    cfg = cfg if isinstance(cfg, dict) else {}
    options = args if isinstance(args, dict) else cfg.get("model")
    if not isinstance(options, dict):
        raise ExportError(f"{where}: neither args nor cfg.model holds the model's options")
    task = cfg.get("task")
    task = task if isinstance(task, dict) else {}
    for key in ("source_lang", "target_lang"):
        if options.get(key) is None and task.get(key) is not None:
            options = {**options, key: task[key]}
    return options


def weights(checkpoint: dict[str, Any], where: Path) -> dict[str, Tensor]:
    """The model's tensors in float32, keyed as fairseq names them."""
    state = checkpoint["model"]
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise ExportError(f"{where}: model entry {bad[0]!r} is not a tensor")
    return {k: v.float() for k, v in state.items()}


def _dictionary_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, word, overwrite) of a dict file, as fairseq's add_from_file splits it."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        word, _, field = line.rstrip("\r").rpartition(" ")
        overwrite = field == "#fairseq:overwrite"
        if overwrite:
            word, _, field = word.rpartition(" ")
        if not word or not field.lstrip("-").isdigit():
            raise ExportError(f"{path}:{number}: expected 'word count', got {line!r}")
        yield number, word, overwrite


def read_dictionary(path: Path) -> list[str]:
    """The symbols of fairseq dictionary ``path`` in id order (module doc)."""
    if not path.is_file():
        raise ExportError(f"{path} does not exist: the checkpoint's dictionary is needed")
    symbols = list(SPECIALS)
    seen = set(symbols)
    for number, word, overwrite in _dictionary_lines(path):
        if word in seen:
            if overwrite:
                continue  # fairseq keeps the word's id and only replaces its count
            raise ExportError(f"{path}:{number}: {word!r} appears twice")
        seen.add(word)
        symbols.append(word)
    return symbols


def find_checkpoint(path: Path) -> Path:
    """``path`` itself (a .pt file), or the checkpoint in directory ``path``."""
    if path.is_file():
        return path
    for name in CHECKPOINT_NAMES:
        if (path / name).is_file():
            return path / name
    found = sorted(path.glob("*.pt")) if path.is_dir() else []
    if len(found) != 1:
        raise ExportError(
            f"{path}: {'no' if not found else 'more than one'} .pt checkpoint "
            f"(looked for {', '.join(CHECKPOINT_NAMES)})"
        )
    return found[0]


def languages(options: dict[str, Any], where: Path) -> tuple[str, str]:
    """The checkpoint's (source, target) languages, which name its dictionaries."""
    source, target = options.get("source_lang"), options.get("target_lang")
    if not (isinstance(source, str) and source and isinstance(target, str) and target):
        directory = where if where.is_dir() else where.parent  # the checkpoint's, or its .pt
        found = sorted(p.name for p in directory.glob("dict.*.txt"))
        beside = f" (beside it: {', '.join(found)})" if found else ""
        raise ExportError(
            f"{where}: source_lang / target_lang not recorded (fairseq-train took them from its "
            f"data directory): give --source-lang and --target-lang{beside}"
        )
    return source, target


def given_languages(
    options: dict[str, Any], given: tuple[str | None, str | None], where: Path
) -> dict[str, Any]:
    """``options`` with the languages given where the checkpoint records none; a given language
    that contradicts a recorded one is refused."""
    for key, value in zip(("source_lang", "target_lang"), given, strict=True):
        if value is None:
            continue
        recorded = options.get(key)
        if recorded is not None and recorded != value:
            side = key.removesuffix("_lang")
            raise ExportError(f"{where}: --{side}-lang {value}: the checkpoint records {recorded}")
        options = {**options, key: value}
    return options


def dictionaries(directory: Path, options: dict[str, Any], where: Path) -> tuple[Path, Path]:
    """(source, target) dictionary files beside the checkpoint: ``dict.SRC.txt`` and
    ``dict.TGT.txt`` of the checkpoint's languages."""
    source, target = languages(options, where)
    return directory / f"dict.{source}.txt", directory / f"dict.{target}.txt"


def is_fairseq(path: str | Path) -> bool:
    """Whether ``path`` is a fairseq checkpoint: a .pt file, or a directory with dict.*.txt."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".pt"
    return path.is_dir() and any(path.glob("dict.*.txt")) and any(path.glob("*.pt"))
