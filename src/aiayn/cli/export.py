"""``aiayn export``: a checkpoint as a Hugging Face MarianMT, CTranslate2 or ONNX model
(``aiayn.export``); ``aiayn import``: a MarianMT directory (``aiayn.export.marian_import``), a
Marian model directory (``model.npz`` + ``decoder.yml``, as OPUS-MT releases it:
``aiayn.export.marian_npz``) or a fairseq checkpoint (``model.pt`` + ``dict.*.txt``:
``aiayn.export.fairseq_import``) as a checkpoint."""

from __future__ import annotations

import argparse

from ..errors import UserError


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
    from ..export.fairseq_import import import_fairseq
    from ..export.fairseq_load import is_fairseq
    from ..export.marian_import import import_marian
    from ..export.marian_npz import import_marian_npz, is_marian_npz

    spm = (args.source_spm or args.spm, args.target_spm or args.spm)
    langs = (args.source_lang, args.target_lang)
    if is_fairseq(args.model):
        out = import_fairseq(
            args.model, args.out, spm=spm, bpe_codes=args.bpe_codes, languages=langs
        )
    elif any(spm) or args.bpe_codes or any(langs):
        raise UserError(
            "--spm, --source-spm, --target-spm, --bpe-codes, --source-lang and --target-lang "
            "are for a fairseq checkpoint"
        )
    else:
        read = import_marian_npz if is_marian_npz(args.model) else import_marian
        out = read(args.model, args.out)
    print(f"imported {args.model} -> {out}")


def add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="turn a Marian model directory (OPUS-MT's .npz), a Hugging Face MarianMT or a "
        "fairseq checkpoint into a checkpoint",
    )
    p.add_argument(
        "model",
        help="Marian's own (model.npz, decoder.yml, vocabularies), a save_pretrained "
        "MarianMTModel, or fairseq's model.pt (or its directory, with dict.SRC.txt, dict.TGT.txt)",
    )
    p.add_argument("--out", required=True, help="the new checkpoint directory (must not exist)")
    p.add_argument(
        "--spm",
        help="fairseq: the SentencePiece model that split both sides' text "
        "(default: the directory's one *.model)",
    )
    p.add_argument("--source-spm", help="fairseq: the source side's SentencePiece model")
    p.add_argument("--target-spm", help="fairseq: the target side's SentencePiece model")
    p.add_argument(
        "--bpe-codes",
        help="fairseq: the subword-nmt BPE codes that split its Moses-tokenized text "
        "(default without a *.model: the directory's bpecodes)",
    )
    for side in ("source", "target"):
        p.add_argument(
            f"--{side}-lang",
            help=f"fairseq: the {side} language (its dict.LANG.txt), where the checkpoint does "
            "not record it (fairseq-train without --source-lang/--target-lang)",
        )
    p.set_defaults(func=_import)
