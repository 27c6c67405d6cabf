"""What every exporter shares: its error type, loading a checkpoint, and writing OUT safely.

An export directory is built in a temporary sibling directory and renamed into place, so that
a crash leaves either the old OUT or the new one. OUT is replaced only when it is empty or
holds the marker file of an earlier export of ours (``aiayn-export.json``): an export never
deletes a directory it did not create. Directories are written here rather than through
``checkpoint``'s helpers because those replace their target unconditionally.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch

from ..config import ModelConfig
from ..errors import UserError
from ..files import check_parent, publish_dir, temp_dir_beside

if TYPE_CHECKING:
    from ..model import DecoderLayer, EncoderLayer, Transformer

MARKER = "aiayn-export.json"


class ExportError(UserError):
    """A model or an output directory that cannot be exported as asked (a user error)."""


def require(module: str, target: str, extra: str = "export") -> ModuleType:
    """Import an optional exporter dependency, or say in one line how to install it (the
    package's ``extra`` that has it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(
            f"exporting to {target} needs the Python package {module!r}: pip install -e '.[{extra}]'"
        ) from None


def refuse_unsupported(cfg: ModelConfig, target: str, supported: set[str]) -> None:
    """Raise ExportError naming every option of ``cfg`` that ``target`` cannot represent.

    ``supported`` names the deviations (see ``deviations``) that the target does represent.
    """
    found = {name: why for name, why in deviations(cfg).items() if name not in supported}
    if found:
        raise ExportError(f"{target} cannot represent this model: " + "; ".join(found.values()))


def refuse_decoding_form(model: Any) -> None:
    """Refuse a model whose Linear layers ``aiayn.runtime.quantize`` converted for decoding
    (packed for oneDNN or int8): the exporters read ``nn.Linear`` weights, which are gone."""
    converted = [
        name
        for name, m in model.named_modules()
        if hasattr(m, "in_features") and not isinstance(m, torch.nn.Linear)
    ]
    if converted:
        raise ExportError(
            f"{len(converted)} Linear layers (e.g. {converted[0]}) were packed or quantized for "
            "decoding; export the model as loaded from its checkpoint"
        )


def deviations(cfg: ModelConfig) -> dict[str, str]:
    """The model's departures from the paper's architecture that an exporter must map."""
    found = {}
    if cfg.norm == "pre":
        found["norm"] = "norm='pre' (pre-LN)"
    if cfg.positional != "sinusoidal":
        found["positional"] = f"positional={cfg.positional!r}"
    if not cfg.scale_attention:
        found["scale_attention"] = "scale_attention=False (no 1/sqrt(d_k))"
    if cfg.attention_window is not None:
        found["attention_window"] = (
            f"attention_window={cfg.attention_window} (restricted attention)"
        )
    if cfg.activation != "relu":
        found["activation"] = f"activation={cfg.activation!r}"
    if cfg.norm_eps != 1e-5:
        found["norm_eps"] = f"norm_eps={cfg.norm_eps} (LayerNorm's epsilon)"
    if cfg.output_bias:
        found["output_bias"] = "output_bias=True (a bias on the pre-softmax layer)"
    if cfg.resolved_d_k * cfg.h != cfg.d_model or cfg.resolved_d_v * cfg.h != cfg.d_model:
        found["d_k"] = (
            f"d_k={cfg.resolved_d_k}, d_v={cfg.resolved_d_v} with h={cfg.h} (need d_k = d_v = d_model / h = {cfg.d_model // cfg.h})"
        )
    return found


def load_for_export(checkpoint: str | os.PathLike) -> tuple[Any, Any]:
    """(Transformer in eval mode on CPU, Vocab) of a checkpoint or averaged directory."""
    from ..checkpoint import load_translator

    return load_translator(Path(checkpoint), "cpu")


def layers(model: Transformer) -> tuple[list[EncoderLayer], list[DecoderLayer]]:
    """The model's encoder and decoder layers as what they are, for the exporters' type checks
    (an ``nn.ModuleList`` yields plain ``Module``s)."""
    return cast("list[EncoderLayer]", list(model.encoder)), cast(
        "list[DecoderLayer]", list(model.decoder)
    )


def check_vocab_size(cfg: ModelConfig, vocab: Any) -> None:
    if len(vocab) != cfg.vocab_size:
        raise ExportError(
            f"{vocab.path} has {len(vocab)} pieces but the model's vocab_size is {cfg.vocab_size}"
        )


def _previous_export(out: Path) -> bool:
    return (out / MARKER).is_file()


def check_out(out: Path) -> None:
    """Refuse an OUT that exists and is not an empty directory or an earlier export of ours."""
    if not out.exists():
        check_parent(out)  # afile/sub: before the work, in a line
        return
    if not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory; not overwriting it")
    if any(out.iterdir()) and not _previous_export(out):
        raise ExportError(
            f"--out {out} is a non-empty directory that is not an aiayn export "
            f"(no {MARKER}); not overwriting it"
        )


@contextmanager
def export_dir(out: str | os.PathLike, info: dict[str, Any]) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success write the marker and rename it to OUT.

    ``info`` (format, source checkpoint, ...) goes into the marker file.
    """
    out = Path(out)
    check_out(out)
    tmp = temp_dir_beside(out)
    try:
        yield tmp
        (tmp / MARKER).write_text(
            json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        check_out(out)  # again: OUT may have appeared while we wrote
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when published
