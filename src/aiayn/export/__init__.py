"""Export a trained translator to other ecosystems, numerically equal to ours.

    aiayn export --checkpoint runs/demo/averaged --to hf --out runs/demo/hf
    aiayn export --checkpoint runs/demo/averaged --to ctranslate2 --out runs/demo/ct2 [--quantization int8]

``hf``: a MarianMT directory for ``transformers`` (see ``export.hf``); ``ctranslate2``: a model
built with CTranslate2's converter API (see ``export.ctranslate2``). Both packages are the
optional extra ``pip install -e '.[export]'``; they are imported only when an export runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..files import check_not_input
from .common import MARKER, ExportError, check_out, load_for_export

FORMATS = ("hf", "ctranslate2")

__all__ = ["FORMATS", "MARKER", "ExportError", "export_checkpoint"]


def export_checkpoint(
    checkpoint: str | os.PathLike, to: str, out: str | os.PathLike, quantization: str | None = None
) -> Path:
    """Export a checkpoint or averaged directory (weights + spm.model) ``to`` "hf" or "ctranslate2"."""
    if to not in FORMATS:
        raise ExportError(f"unknown export format {to!r}; choose one of: {', '.join(FORMATS)}")
    if quantization is not None and to != "ctranslate2":
        raise ExportError("--quantization applies to --to ctranslate2 only")
    check_not_input(out, [checkpoint], option="--out", whole_dir=True)  # out is replaced whole
    check_out(Path(out))  # refuse before the work, not after it
    model, vocab = load_for_export(checkpoint)
    if to == "hf":
        from .hf import export_hf

        return export_hf(model, vocab, out, source=str(checkpoint))
    from .ctranslate2 import export_ctranslate2

    return export_ctranslate2(model, vocab, out, quantization=quantization, source=str(checkpoint))
