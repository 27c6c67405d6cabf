"""How often the exported models translate exactly as we do: CTranslate2, ONNX, Hugging Face.

    python scripts/export_agreement.py --checkpoint runs/demo/averaged --data work/bible
    python scripts/export_agreement.py ... --hf-limit 300 --require-ct2 0.99   # exit 1 below 99%
    python scripts/export_agreement.py ... --ct2-patience 1 2 3 4 8   # agreement against patience
    python scripts/export_agreement.py ... --peers onnx --record records   # the ONNX export

Decodes a split's sources (token ids, as the data pipeline stores them) with our beam search
(the "translation" preset: beam 4, GNMT alpha 0.6, |Y| <= |X| + 50) and compares token for
token with:

- ``ct2``: the CTranslate2 export, ``translate_pieces`` (its beam search, n-best re-ranked with
  the GNMT penalty, our length limit per sentence);
- ``ct2_plain``: the same export, plain ``translate_batch(beam_size=4, length_penalty=0.6)``,
  which ranks by log P / |Y|^0.6;
- ``hf``: the Hugging Face export, ``generate`` with the exported defaults (beam 4,
  length_penalty 0.6 = HF's log P / |Y|^0.6) and our per-sentence length limit;
- ``onnx`` (``--peers onnx``): the ONNX export in fp32 under our own search
  (``--engine onnxruntime``): the ``--nbest`` lists compared whole, token for token, the
  largest difference of their log-probabilities, and of the log-probability of each token of
  our best outputs forced through both (the goal: 1e-4); each sentence whose list differs is
  listed with the margin between our two best, a near tie where it is small.

Prints one JSON object: sentences compared and the share equal for each. ``--record DIR``:
the ONNX figures as a record (``aiayn.records``, topic export: docs/export.md's table). Needs
the export extra (pip install -e '.[export]'), and '.[onnx]' for ONNX. Cost on 2 CPU cores for
the 1,523 demo test sentences: ours and CTranslate2 a few minutes each, ONNX about ours; HF
generate is the slowest, hence ``--hf-limit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
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

    from aiayn.export.ct2_search import translate_pieces
    from aiayn.export.ctranslate2 import export_ctranslate2

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


def onnx_agreement(
    model, vocab, sources: list[list[int]], config: DecodeConfig, tmp: Path, threads: int
) -> dict:
    """Our ``config.nbest`` lists against the same search on the ONNX export (fp32): counts,
    the largest log-probability differences, and the sentences whose lists differ."""
    from aiayn.export.onnx import export_onnx
    from aiayn.export.onnx_engine import OnnxEngine

    engine = OnnxEngine.open(export_onnx(model, vocab, tmp / "onnx"), threads=threads)
    request = SearchRequest(config)
    with_eos = [s + [vocab.eos_id] for s in sources]
    ours_nbest = decode_ids(model, with_eos, request)
    theirs_nbest = engine.decode_ids(with_eos, request)
    tokens = lambda hyps: [h.tokens for h in hyps]  # noqa: E731
    unequal = [
        i for i, (a, b) in enumerate(zip(ours_nbest, theirs_nbest)) if tokens(a) != tokens(b)
    ]
    apart = [
        abs(a.log_prob - b.log_prob)
        for x, y in zip(ours_nbest, theirs_nbest)
        if tokens(x) == tokens(y)
        for a, b in zip(x, y)
    ]
    best = [h[0].tokens if h else [] for h in ours_nbest]
    return {
        "sentences": len(sources),
        "nbest": config.nbest,
        "nbest_equal": len(sources) - len(unequal),
        "best_equal": sum(tokens(a)[:1] == tokens(b)[:1] for a, b in zip(ours_nbest, theirs_nbest)),
        "max_nbest_log_prob_difference": max(apart, default=0.0),
        "max_token_log_prob_difference": forced_token_difference(
            model, engine.model, with_eos, best, vocab
        ),
        "unequal": [
            {
                "sentence": i,
                "ours": [vocab.decode(t) for t in tokens(ours_nbest[i])],
                "onnx": [vocab.decode(t) for t in tokens(theirs_nbest[i])],
                "ours_margin": margin(ours_nbest[i]),
            }
            for i in unequal
        ],
    }


def margin(hyps) -> float | None:
    """The score between our best and second best: a near tie when small."""
    return round(hyps[0].score - hyps[1].score, 6) if len(hyps) > 1 else None


def forced_token_difference(model, onnx_model, sources, targets, vocab, size: int = 32) -> float:
    """The largest difference between our and the graphs' log-probability of each token of
    ``targets`` (and the eos after it), fed to both step by step, ``size`` sentences at once."""
    from aiayn.decode.cache import decode_step, new_cache

    worst = 0.0
    for start in range(0, len(sources), size):
        src = pad(sources[start : start + size], vocab.pad_id)
        outs = [t + [vocab.eos_id] for t in targets[start : start + size]]
        gold = pad(outs, vocab.pad_id)
        with torch.inference_mode():
            cache = new_cache(model, model.encode(src), model.src_mask(src))
        theirs_cache = onnx_model.new_cache(onnx_model.encode(src), onnx_model.src_mask(src))
        step = torch.full((len(outs), 1), vocab.bos_id)
        for t in range(gold.size(1)):
            with torch.inference_mode():
                ours = torch.log_softmax(decode_step(model, step, cache).float(), dim=-1)
            theirs = onnx_model.decode_step(step, theirs_cache)
            live = torch.tensor([t < len(o) for o in outs])
            at = gold[:, t : t + 1]
            apart = (ours.gather(1, at) - theirs.gather(1, at)).abs()[live]
            worst = max(worst, float(apart.max()))
            step = at
    return worst


def pad(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), pad_id)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def onnx_record(args: argparse.Namespace, found: dict) -> Path:
    """The ONNX agreement as a record of topic export (docs/export.md's table)."""
    from aiayn.records import make_record, package_version, write_record

    n, unequal = found["sentences"], found["unequal"]
    record = make_record(
        topic="export",
        what=f"ONNX export of {args.checkpoint}: {found['nbest']}-best lists equal to ours, "
        f"{args.split} split",
        figures={
            f"{found['nbest']}-best lists equal": f"{found['nbest_equal']:,} / {n:,}",
            "best equal": f"{found['best_equal']:,} / {n:,}",
            "max token log-prob difference": float(f"{found['max_token_log_prob_difference']:.2g}"),
            "max n-best log-prob difference": float(
                f"{found['max_nbest_log_prob_difference']:.2g}"
            ),
        },
        command="python scripts/export_agreement.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={"onnxruntime": package_version("onnxruntime")},
        notes="fp32; lists unequal: "
        + (
            ", ".join(f"sentence {u['sentence']} (margin {u['ours_margin']})" for u in unequal)
            or "none"
        ),
    )
    return write_record(record, args.record)


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
    parser.add_argument(
        "--peers", nargs="+", default=["ct2"], choices=["ct2", "onnx"], help="(default: ct2)"
    )
    parser.add_argument("--nbest", type=int, default=4, help="onnx: the lists compared")
    parser.add_argument("--record", metavar="DIR", help="onnx: its figures as a record in DIR")
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
        from aiayn.export.ct2_search import PATIENCE

        patiences = args.ct2_patience or [PATIENCE]
        if "ct2" in args.peers:
            gnmt, plain, seconds = ct2(
                model, vocab, sources, config, Path(tmp), args.threads, patiences
            )
            report.update(
                ct2=share_equal(reference, gnmt[patiences[0]]),
                ct2_plain=share_equal(reference, plain),
                ct2_seconds=round(seconds[patiences[0]], 1),
                ct2_by_patience={
                    str(p): {
                        "equal": share_equal(reference, gnmt[p]),
                        "seconds": round(seconds[p], 1),
                    }
                    for p in patiences
                },
            )
        if "onnx" in args.peers:
            nbest = replace(config, nbest=args.nbest, beam=max(config.beam, args.nbest))
            report["onnx"] = onnx_agreement(model, vocab, sources, nbest, Path(tmp), args.threads)
            if args.record:
                print(f"wrote {onnx_record(args, report['onnx'])}", file=sys.stderr)
        if args.hf_limit:
            m = min(args.hf_limit, n)
            report.update(
                hf=share_equal(reference[:m], hf(model, vocab, sources[:m], config, Path(tmp))),
                hf_sentences=m,
            )
    print(json.dumps(report, indent=2))
    if args.require_ct2 is not None and report.get("ct2", 0.0) < args.require_ct2:
        sys.exit(1)


if __name__ == "__main__":
    main()
