"""Export a trained translator to other ecosystems, numerically equal to ours.

    aiayn export --checkpoint runs/demo/averaged --to hf --out runs/demo/hf
    aiayn export --checkpoint runs/demo/averaged --to ctranslate2 --out runs/demo/ct2 [--quantization int8]
    aiayn export --checkpoint runs/demo/averaged --to onnx --out runs/demo/onnx [--quantization int8]

``hf``: a MarianMT directory for ``transformers`` (see ``export.hf``); ``ctranslate2``: a model
built with CTranslate2's converter API (see ``export.ctranslate2``). Both packages are the
optional extra ``pip install -e '.[export]'``; they are imported only when an export runs.
``onnx``: the encoder and a decoder step for ONNX Runtime (see ``export.onnx``), the extra
``pip install -e '.[onnx]'``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..files import check_not_input
from .common import MARKER, ExportError, check_out, load_for_export

FORMATS = ("hf", "ctranslate2", "onnx")
QUANTIZED = ("ctranslate2", "onnx")  # the formats --quantization applies to

__all__ = ["FORMATS", "MARKER", "ExportError", "export_checkpoint"]


def export_checkpoint(
    checkpoint: str | os.PathLike, to: str, out: str | os.PathLike, quantization: str | None = None
) -> Path:
    """Export a checkpoint or averaged directory (weights + spm.model) ``to`` one of ``FORMATS``."""
    if to not in FORMATS:
        raise ExportError(f"unknown export format {to!r}; choose one of: {', '.join(FORMATS)}")
    if quantization is not None and to not in QUANTIZED:
        raise ExportError(f"--quantization applies to --to {' or '.join(QUANTIZED)} only")
    check_not_input(out, [checkpoint], option="--out", whole_dir=True)  # out is replaced whole
    check_out(Path(out))  # refuse before the work, not after it
    model, vocab = load_for_export(checkpoint)
    if to == "hf":
        from .hf import export_hf

        return export_hf(model, vocab, out, source=str(checkpoint))
    if to == "onnx":
        from .onnx import export_onnx

        return export_onnx(model, vocab, out, quantization=quantization, source=str(checkpoint))
    from .ctranslate2 import export_ctranslate2

    return export_ctranslate2(model, vocab, out, quantization=quantization, source=str(checkpoint))
