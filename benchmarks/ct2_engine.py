"""``--engine ctranslate2`` against raw CTranslate2 in a process of its own, on real sentences:
what our ranking, per-sentence output limits and sharing a process with PyTorch cost.

    python benchmarks/ct2_engine.py --checkpoint runs/demo/averaged --limit 300 --rounds 3
    python benchmarks/ct2_engine.py --checkpoint runs/demo/averaged --workers 2   # 2 replicas each

Engine: ``CTranslate2Engine.decode_ids`` (the paper's search: GNMT re-ranking, |Y| <= |X| + 50
per sentence as ``search_pieces`` applies it, patience ``PATIENCE``) in this process, after PyTorch has decoded a sentence,
so both OpenMP runtimes are up. Raw: ``translate_batch(beam_size=4, length_penalty=0.6)`` of the
same export in ``ct2_worker.py`` (no torch), with the longest source's limit for every sentence,
twice: with CTranslate2's default patience 1 (``raw``, what its users get) and with the
engine's (``raw_same_patience``: what the rest of the engine costs). Rounds interleave the
three; prints one JSON object with the medians, engine / raw speeds (goal: >= 0.95), the load
and the CPU. Writes the export cache beside the checkpoint, as the engine does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode_throughput import Ct2Process  # noqa: E402

from aiayn.checkpoint import load_translator  # noqa: E402
from aiayn.data import bundled_corpus_paths  # noqa: E402
from aiayn.decode import Batching, DecodeConfig, SearchRequest, translate  # noqa: E402
from aiayn.export.ctranslate2 import PATIENCE  # noqa: E402
from aiayn.export.engine import CTranslate2Engine, cached_export  # noqa: E402
from aiayn.files import read_lines  # noqa: E402
from aiayn.hardware import cpu_description  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--limit", type=int, default=300, help="the first N test verses")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, default=1, help="replicas sharing the threads, on both sides"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = load_translator(args.checkpoint)
    lines = read_lines(bundled_corpus_paths()["test"][0])[: args.limit]
    translate(model, lines[:1], vocab)  # PyTorch's thread pool is up
    engine = CTranslate2Engine.open(args.checkpoint, threads=args.threads, workers=args.workers)
    raw = Ct2Process(str(cached_export(args.checkpoint)), "float32", args.threads, args.workers)
    ids = [vocab.encode_source(line, model.cfg.max_len) for line in lines]
    pieces = [[vocab.id_to_piece(i) for i in s[:-1]] for s in ids]
    limit = int(DecodeConfig().max_len(torch.tensor([max(map(len, ids))]), model.cfg.max_len))
    seconds: dict[str, list[float]] = {"engine": [], "raw": [], "raw_same_patience": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        engine.decode_ids(
            ids, SearchRequest(batching=Batching(workers=args.workers)).with_ids(vocab)
        )
        seconds["engine"].append(time.perf_counter() - start)
        for side, patience in (("raw", 1.0), ("raw_same_patience", PATIENCE)):
            answer = raw(
                sources=pieces,
                batch=64,
                beam=4,
                max_len=limit,
                length_penalty=0.6,
                patience=patience,
            )
            seconds[side].append(answer["seconds"])
    raw.close()
    medians = {side: statistics.median(s) for side, s in seconds.items()}
    report = {
        "checkpoint": args.checkpoint,
        "sentences": len(ids),
        "threads": args.threads,
        "workers": args.workers,
        "seconds": seconds,
        "median_s": medians,
        "patience": PATIENCE,
        "engine_vs_raw_speed": medians["raw"] / medians["engine"],
        "engine_vs_raw_same_patience_speed": medians["raw_same_patience"] / medians["engine"],
        "load": os.getloadavg(),
        "cpu": cpu_description(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
