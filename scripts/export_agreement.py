"""How often the exported models translate exactly as we do: CTranslate2 and Hugging Face.

    python scripts/export_agreement.py --checkpoint runs/demo/averaged --data work/bible
    python scripts/export_agreement.py ... --hf-limit 300 --require-ct2 0.99   # exit 1 below 99%
    python scripts/export_agreement.py ... --ct2-patience 1 2 3 4 8   # agreement against patience

Decodes a split's sources (token ids, as the data pipeline stores them) with our beam search
(the "translation" preset: beam 4, GNMT alpha 0.6, |Y| <= |X| + 50) and compares token for
token with:

- ``ct2``: the CTranslate2 export, ``translate_pieces`` (its beam search, n-best re-ranked with
  the GNMT penalty, our length limit per sentence);
- ``ct2_plain``: the same export, plain ``translate_batch(beam_size=4, length_penalty=0.6)``,
  which ranks by log P / |Y|^0.6;
- ``hf``: the Hugging Face export, ``generate`` with the exported defaults (beam 4,
  length_penalty 0.6 = HF's log P / |Y|^0.6) and our per-sentence length limit.

Prints one JSON object: sentences compared and the share equal for each. Needs the export
extra (pip install -e '.[export]'). Cost on 2 CPU cores for the 1,523 demo test sentences:
ours and CTranslate2 a few minutes; HF generate is the slowest, hence ``--hf-limit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from aiayn.data import TokenDataset
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids
from aiayn.export.common import load_for_export


def ours(model, sources: list[list[int]], config: DecodeConfig, eos: int) -> list[list[int]]:
    return [
        h[0].tokens if h else []
        for h in decode_ids(model, [s + [eos] for s in sources], SearchRequest(config))
    ]


def ct2(
    model,
    vocab,
    sources: list[list[int]],
    config: DecodeConfig,
    tmp: Path,
    threads: int,
    patiences: list[float],
):
    import ctranslate2

    from aiayn.export.ctranslate2 import export_ctranslate2, translate_pieces

    translator = ctranslate2.Translator(
        str(export_ctranslate2(model, vocab, tmp / "ct2")),
        device="cpu",
        compute_type="float32",
        intra_threads=threads,
    )
    pieces = [[vocab.id_to_piece(i) for i in s] for s in sources]
    ids = lambda out: [vocab.piece_to_id(p) for p in out]  # noqa: E731
    gnmt, seconds = {}, {}
    for patience in patiences:
        start = time.perf_counter()
        found = translate_pieces(
            translator, pieces, config, max_len_cap=model.cfg.max_len, patience=patience
        )
        seconds[patience] = time.perf_counter() - start
        gnmt[patience] = [ids(o) for o in found]
    limit = int(config.max_len(torch.tensor([max(map(len, sources)) + 1]), model.cfg.max_len)[0])
    plain = translator.translate_batch(
        pieces,
        beam_size=config.beam,
        length_penalty=config.alpha,
        max_decoding_length=limit,
        max_batch_size=64,
    )
    return gnmt, [ids(r.hypotheses[0]) for r in plain], seconds


def hf(model, vocab, sources: list[list[int]], config: DecodeConfig, tmp: Path) -> list[list[int]]:
    from transformers import MarianMTModel

    from aiayn.export.hf import export_hf

    marian = MarianMTModel.from_pretrained(str(export_hf(model, vocab, tmp / "hf"))).eval()
    limits = config.max_len(torch.tensor([len(s) + 1 for s in sources]), model.cfg.max_len).tolist()
    groups: dict[int, list[int]] = defaultdict(list)
    for i, limit in enumerate(limits):
        groups[limit].append(i)
    outputs: list[list[int]] = [[] for _ in sources]
    eos, pad = vocab.eos_id, vocab.pad_id
    with torch.inference_mode():
        for limit, members in groups.items():
            for start in range(0, len(members), 32):
                chunk = members[start : start + 32]
                width = max(len(sources[i]) + 1 for i in chunk)
                src = torch.full((len(chunk), width), pad)
                for row, i in enumerate(chunk):
                    src[row, : len(sources[i]) + 1] = torch.tensor(sources[i] + [eos])
                generated = marian.generate(
                    input_ids=src,
                    attention_mask=(src != pad).long(),
                    max_new_tokens=limit,
                    max_length=None,
                )
                for i, row in zip(chunk, generated[:, 1:].tolist()):  # drop the decoder start
                    outputs[i] = (
                        row[: row.index(eos)] if eos in row else [t for t in row if t != pad]
                    )
    return outputs


def share_equal(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="prepared dataset directory")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, help="the first N sentences only")
    parser.add_argument(
        "--hf-limit", type=int, default=0, help="sentences decoded with HF generate (0: none)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ct2-patience",
        type=float,
        nargs="+",
        help="CTranslate2's patience for translate_pieces, each reported (default: PATIENCE)",
    )
    parser.add_argument("--require-ct2", type=float, help="exit 1 if the ct2 share is below this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = load_for_export(args.checkpoint)
    data = TokenDataset(args.data, args.split)
    n = len(data) if args.limit is None else min(args.limit, len(data))
    sources = [data.src(i).tolist() for i in range(n)]
    config = DecodeConfig.preset("translation")
    start = time.perf_counter()
    reference = ours(model, sources, config, vocab.eos_id)
    report = {
        "checkpoint": args.checkpoint,
        "split": args.split,
        "sentences": n,
        "ours_seconds": round(time.perf_counter() - start, 1),
    }
    with tempfile.TemporaryDirectory() as tmp:
        from aiayn.export.ctranslate2 import PATIENCE

        patiences = args.ct2_patience or [PATIENCE]
        gnmt, plain, seconds = ct2(
            model, vocab, sources, config, Path(tmp), args.threads, patiences
        )
        report.update(
            ct2=share_equal(reference, gnmt[patiences[0]]),
            ct2_plain=share_equal(reference, plain),
            ct2_seconds=round(seconds[patiences[0]], 1),
            ct2_by_patience={
                str(p): {"equal": share_equal(reference, gnmt[p]), "seconds": round(seconds[p], 1)}
                for p in patiences
            },
        )
        if args.hf_limit:
            m = min(args.hf_limit, n)
            report.update(
                hf=share_equal(reference[:m], hf(model, vocab, sources[:m], config, Path(tmp))),
                hf_sentences=m,
            )
    print(json.dumps(report, indent=2))
    if args.require_ct2 is not None and report["ct2"] < args.require_ct2:
        sys.exit(1)


if __name__ == "__main__":
    main()
