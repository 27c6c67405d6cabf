"""``aiayn export``: a checkpoint as a Hugging Face MarianMT, CTranslate2 or ONNX model
(``aiayn.export``); ``aiayn import``: a MarianMT directory (``aiayn.export.marian_import``) or a
Marian model directory (``model.npz`` + ``decoder.yml``, as OPUS-MT releases it:
``aiayn.export.marian_npz``) as a checkpoint."""

from __future__ import annotations

import argparse


def _export(args: argparse.Namespace) -> None:
    from ..export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.to, args.out, quantization=args.quantization)
    print(f"exported {args.checkpoint} to {args.to} -> {out}")


def add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a checkpoint as a Hugging Face MarianMT, CTranslate2 or ONNX model"
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    p.add_argument("--to", required=True, choices=["hf", "ctranslate2", "onnx"])
    p.add_argument(
        "--out", required=True, help="new directory (or an earlier export, which is replaced)"
    )
    p.add_argument(
        "--quantization",
        help="ctranslate2 and onnx: weight type, e.g. int8 (default: float32; onnx: int8 only)",
    )
    p.set_defaults(func=_export)


def _import(args: argparse.Namespace) -> None:
    from ..export.marian_import import import_marian
    from ..export.marian_npz import import_marian_npz, is_marian_npz

    read = import_marian_npz if is_marian_npz(args.marian_dir) else import_marian
    out = read(args.marian_dir, args.out)
    print(f"imported {args.marian_dir} -> {out}")


def add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="turn a Marian model directory (OPUS-MT's .npz) or a Hugging Face MarianMT into a checkpoint",
    )
    p.add_argument(
        "marian_dir",
        help="Marian's own (model.npz, decoder.yml, vocabularies) or a save_pretrained MarianMTModel",
    )
    p.add_argument("--out", required=True, help="the new checkpoint directory (must not exist)")
    p.set_defaults(func=_import)
