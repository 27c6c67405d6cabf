"""Decoding throughput on CPU: aiayn beam search vs Hugging Face Marian, CTranslate2, ONNX Runtime.

Same weights in all three, through ``aiayn export``'s own exporters (``to_marian``: a
``MarianMTModel`` with equal logits; ``export_ctranslate2``: a CTranslate2 model built with its
converter API),
same random source sentences, beam 4, exactly 40 output tokens (eos forbidden before 40 on every
side), fp32 (``--quantize int8``: ours int8 vs CTranslate2 int8), 2 threads. Before timing, our
logits are checked against Hugging Face's. CTranslate2 runs in a process of its own
(``ct2_worker.py``), so that its OpenMP runtime does not share a process with PyTorch's.

``--testset CHECKPOINT``: the real job instead, the bundled test split (1,523 verses, from the
package's corpus/bible) translated with the checkpoint by us (``translate``, as ``aiayn
evaluate`` does) and by CTranslate2 converted from the same weights (beam 4, its own length
penalty, max length = longest source + 50); wall time of each, interleaved. With ``--unpacked``
also our fp32 model without packed weights, and how many of its outputs equal the packed
model's; ``--limit N`` takes the first N verses.

Cost: about 2 minutes on 2 CPU cores for both configurations. Needs the peers (never the
package's own venv):

    python3 -m venv ../benchvenv-decode
    ../benchvenv-decode/bin/pip install torch==2.13.0
    ../benchvenv-decode/bin/pip install transformers ctranslate2 sentencepiece sacrebleu
    ../benchvenv-decode/bin/python benchmarks/decode_throughput.py

Prints target tokens/s (40 x sentences / seconds) per system and batch size, and our ratios.

    python benchmarks/decode_throughput.py --quantize int8      # ours int8 vs CTranslate2 int8
    python benchmarks/decode_throughput.py --testset runs/demo/averaged [--quantize int8]
    python benchmarks/decode_throughput.py --testset runs/demo/averaged --unpacked --limit 300

``--engine CHECKPOINT``: ``--engine ctranslate2`` (``CTranslate2Engine.decode_ids``, the paper's
search: GNMT re-ranking, |Y| <= |X| + 50 per sentence, patience ``PATIENCE``) in this process,
after PyTorch has decoded a sentence so that both OpenMP runtimes are up, against raw
CTranslate2 (``translate_batch(beam_size=4, length_penalty=0.6)`` of the same export in
``ct2_worker.py``, the longest source's limit for every sentence) with its default patience 1
(what its users get) and with the engine's (what the rest of the engine costs), on the first
``--limit`` (300) test verses, ``--repeats`` rounds interleaved; ``--workers N``: N replicas on
both sides. Writes the export cache beside the checkpoint, as the engine does.

    python benchmarks/decode_throughput.py --engine runs/demo/averaged --repeats 3

``--peers onnx``: also our search on the model's ONNX export (``--engine onnxruntime``: the
graphs of ``aiayn export --to onnx``, int8 with ``--quantize int8``: ONNX Runtime's dynamic
quantization), in this process with ``--threads`` intra-op threads. ``--model CHECKPOINT``: the
same random sources and 40 tokens on a trained checkpoint's model instead of ``--configs``.
The measurements of docs/export.md, one command per thread count and precision:

    for q in "" "--quantize int8"; do for t in 1 2; do
      python benchmarks/decode_throughput.py --model runs/demo/averaged --peers ct2 onnx \
        --threads $t $q --record records; done; done

``--record DIR`` writes each comparison's figures as a record (``aiayn.records``; topic
decoding, or export with the ONNX peer: docs/export.md's table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from aiayn import ModelConfig, Transformer  # noqa: E402
from aiayn.decode import (  # noqa: E402
    Batching,
    DecodeConfig,
    SearchRequest,
    beam_search,
    for_decoding,
    translate,
)
from aiayn.export.ctranslate2 import export_ctranslate2  # noqa: E402
from aiayn.export.hf import to_marian  # noqa: E402
from aiayn.records import make_record, package_version, write_record  # noqa: E402
from aiayn.runtime.workers import run_batches  # noqa: E402

PAD, UNK, BOS, EOS = 0, 1, 2, 3
OUT_LEN, BEAM = 40, 4
CONFIGS = {
    "tiny": dict(N_enc=1, N_dec=1, d_model=32, h=2, d_ff=64, vocab_size=300),  # a check, seconds
    "d256": dict(N_enc=3, N_dec=3, d_model=256, h=4, d_ff=1024, vocab_size=8000),
    "base": dict(N_enc=6, N_dec=6, d_model=512, h=8, d_ff=2048, vocab_size=8000),
}


def our_model(fields: dict) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(P_drop=0.0, **fields)).eval()


def check_logits(model: Transformer, hf, src: torch.Tensor) -> float:
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS), src[:, :7].clamp(min=4)], dim=1)
    mask = (src != PAD).long()
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in).logits
    diff = (ours - theirs).abs().max().item()
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), f"logits differ by {diff}"
    return diff


class _Pieces:
    """Made-up pieces for random weights: what ``aiayn.export`` reads of a vocabulary (no
    SentencePiece file, so none is copied beside the CTranslate2 model)."""

    pad_id, unk_id, bos_id, eos_id, path = PAD, UNK, BOS, EOS, None

    def __init__(self, size: int) -> None:
        self.tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, size)]

    def __len__(self) -> int:
        return len(self.tokens)

    def id_to_piece(self, i: int) -> str:
        return self.tokens[i]

    def source(self, ids: list[int]) -> list[str]:
        """Pieces of an id source ending in eos, without it: the exported model appends it."""
        return [self.tokens[i] for i in ids[:-1]]


def onnx_model(model: Transformer, out_dir: str, quantization: str | None, threads: int):
    """``model`` exported by ``aiayn export --to onnx`` (int8: quantized after export), as
    the decoding interface our search drives (``OnnxModel``, what ``--engine onnxruntime``
    decodes with), its sessions on ``threads`` intra-op threads."""
    from pathlib import Path

    from aiayn.export.onnx import CONFIG, DECODER, ENCODER, export_onnx, session
    from aiayn.export.onnx_engine import OnnxModel

    vocab = _Pieces(model.cfg.vocab_size)
    out = export_onnx(model, vocab, Path(out_dir) / "onnx", quantization=quantization)
    config = json.loads((out / CONFIG).read_text(encoding="utf-8"))
    return OnnxModel(session(out / ENCODER, threads), session(out / DECODER, threads), config)


def ct2_model(model: Transformer, out_dir: str) -> tuple[str, _Pieces]:
    """``model`` converted by ``aiayn export``'s own CTranslate2 exporter."""
    vocab = _Pieces(model.cfg.vocab_size)
    return str(export_ctranslate2(model, vocab, os.path.join(out_dir, "ct2"))), vocab


class Ct2Process:
    """A CTranslate2 translator in its own process (``ct2_worker.py``), one request per call."""

    def __init__(
        self,
        model_dir: str,
        compute_type: str,
        threads: int,
        replicas: int = 1,
        device: str = "cpu",
    ) -> None:
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ct2_worker.py")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen(
            [sys.executable, worker, model_dir, compute_type, str(threads), str(replicas), device],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, **request) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def sources(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(15, 31, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (L - 1,), generator=g).tolist() + [EOS] for L in lengths]


def batches(srcs: list[list[int]], size: int):
    for i in range(0, len(srcs), size):
        chunk = srcs[i : i + size]
        src = torch.full((len(chunk), max(map(len, chunk))), PAD)
        for r, s in enumerate(chunk):
            src[r, : len(s)] = torch.tensor(s)
        yield chunk, src


def run_ours(model, srcs, size, workers: int = 1) -> float:
    """Seconds for our search over ``srcs`` in chunks of ``size``; ``workers`` > 1: the chunks
    shared among forked processes as ``--workers`` does (the forks timed too)."""
    config = DecodeConfig(beam=BEAM, alpha=0.6, max_len_a=0, max_len_b=OUT_LEN)
    chunks = [src for _, src in batches(srcs, size)]
    start = time.perf_counter()
    with torch.inference_mode():
        decode = lambda i: beam_search(model, chunks[i], config, min_len=OUT_LEN)  # noqa: E731
        for _, hyps in run_batches(decode, len(chunks), workers=workers):
            assert all(len(h[0].tokens) >= OUT_LEN - 1 for h in hyps)
    return time.perf_counter() - start


def run_hf(hf, srcs, size) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for _, src in batches(srcs, size):
            out = hf.generate(
                input_ids=src,
                attention_mask=(src != PAD).long(),
                num_beams=BEAM,
                max_new_tokens=OUT_LEN,
                min_new_tokens=OUT_LEN,
                do_sample=False,
                length_penalty=0.6,
                early_stopping=False,
                max_length=None,
            )
            assert out.size(1) >= OUT_LEN
    return time.perf_counter() - start


def run_ct2(ct2: Ct2Process, vocab, srcs, size) -> float:
    """Seconds inside the worker, over the same chunks of ``size`` sentences in the same order."""
    seconds = 0.0
    for chunk, _ in batches(srcs, size):
        res = ct2(
            sources=[vocab.source(s) for s in chunk],
            batch=size,
            beam=BEAM,
            min_len=OUT_LEN,
            max_len=OUT_LEN,
        )
        assert len(res["outputs"][0]) >= OUT_LEN - 1
        seconds += res["seconds"]
    return seconds


def tokens_per_second(systems: dict, srcs, size, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` rate per system, the systems interleaved within each repeat so that
    load from other processes on a shared machine hits them alike."""
    for fn in systems.values():
        fn(srcs[:size], size)  # warm-up
    best = {name: float("inf") for name in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            best[name] = min(best[name], fn(srcs, size))
    return {name: OUT_LEN * len(srcs) / t for name, t in best.items()}


def test_split_times(
    checkpoint: str,
    quantize_mode: str | None,
    repeats: int,
    tmp: str,
    unpacked: bool = False,
    limit: int | None = None,
) -> dict[str, float]:
    """The real job: the bundled test split (its first ``limit`` verses), ours (as ``aiayn
    evaluate`` decodes) vs CTranslate2; with ``unpacked`` also our fp32 model without packed
    weights, and how many outputs it shares with the packed one. Returns the median seconds."""
    from aiayn.checkpoint import VOCAB, load_transformer
    from aiayn.data import Vocab, bundled_corpus_paths
    from aiayn.files import read_lines

    model = for_decoding(load_transformer(checkpoint)[0], quantize_mode)
    plain = load_transformer(checkpoint)[0].eval() if unpacked and not quantize_mode else None
    vocab = Vocab.load(os.path.join(checkpoint, VOCAB))
    lines = read_lines(bundled_corpus_paths()["test"][0])[:limit]
    ids = [vocab.encode_source(line) for line in lines if line.strip()]
    fp32 = load_transformer(checkpoint)[0]  # as trained, for the export: ours is packed or int8
    ct2_dir, names = ct2_model(fp32, tmp)
    ct2 = Ct2Process(ct2_dir, "int8" if quantize_mode else "float32", torch.get_num_threads())
    max_len = max(map(len, ids)) + 50

    def ours(m) -> tuple[float, list[str]]:
        start = time.perf_counter()
        with torch.inference_mode():
            out = translate(m, lines, vocab, SearchRequest(batching=Batching(max_tokens=4000)))
        return time.perf_counter() - start, out

    def theirs() -> float:
        start = time.perf_counter()  # wall time, including the transfer to the worker
        ct2(sources=[names.source(s) for s in ids], batch=64, beam=BEAM, max_len=max_len)
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {"ours": [], "ct2": []}
    for repeat in range(repeats):
        (t_ours, out), t_ct2 = ours(model), theirs()
        seconds["ours"].append(t_ours)
        seconds["ct2"].append(t_ct2)
        line = (
            f"[test split, {len(ids)} sentences, {quantize_mode or 'fp32'}] repeat {repeat + 1}: "
            f"ours {t_ours:.1f} s ({len(ids) / t_ours:.1f} sent/s)  ct2 {t_ct2:.1f} s "
            f"({len(ids) / t_ct2:.1f} sent/s)  ours/ct2 speed {t_ct2 / t_ours:.2f}"
        )
        if plain is not None:
            t_plain, out_plain = ours(plain)
            same = sum(a == b for a, b in zip(out, out_plain))
            line += f"  unpacked {t_plain:.1f} s, ours/unpacked speed {t_plain / t_ours:.2f}, identical {same}/{len(out)}"
        print(line, flush=True)
    ct2.close()
    return {side: statistics.median(times) for side, times in seconds.items()} | {"n": len(ids)}


def engine_times(checkpoint: str, limit: int, rounds: int, workers: int) -> dict[str, float]:
    """Median seconds of ``--engine ctranslate2`` and of raw CTranslate2 twice (patience 1 and
    the engine's), interleaved over ``rounds``, on the first ``limit`` test verses."""
    from aiayn.checkpoint import load_translator
    from aiayn.data import bundled_corpus_paths
    from aiayn.export.ct2_search import PATIENCE
    from aiayn.export.engine import CTranslate2Engine, cached_export
    from aiayn.files import read_lines

    threads = torch.get_num_threads()
    model, vocab = load_translator(checkpoint)
    lines = read_lines(bundled_corpus_paths()["test"][0])[:limit]
    translate(model, lines[:1], vocab)  # PyTorch's thread pool is up
    engine = CTranslate2Engine.open(checkpoint, threads=threads, workers=workers)
    raw = Ct2Process(str(cached_export(checkpoint)), "float32", threads, workers)
    ids = [vocab.encode_source(line, model.cfg.max_len) for line in lines]
    pieces = [[vocab.id_to_piece(i) for i in s[:-1]] for s in ids]
    max_len = int(DecodeConfig().max_len(torch.tensor([max(map(len, ids))]), model.cfg.max_len))
    seconds: dict[str, list[float]] = {"engine": [], "raw": [], "raw_same_patience": []}
    request = SearchRequest(batching=Batching(workers=workers)).with_ids(vocab)
    for _ in range(rounds):
        start = time.perf_counter()
        engine.decode_ids(ids, request)
        seconds["engine"].append(time.perf_counter() - start)
        for side, patience in (("raw", 1.0), ("raw_same_patience", PATIENCE)):
            answer = raw(
                sources=pieces, batch=64, beam=4, max_len=max_len, length_penalty=0.6,
                patience=patience,
            )  # fmt: skip
            seconds[side].append(answer["seconds"])
    raw.close()
    medians = {side: statistics.median(times) for side, times in seconds.items()}
    print(json.dumps({"sentences": len(ids), "seconds": seconds, "median_s": medians}, indent=1))
    print(
        f"engine / raw speed {medians['raw'] / medians['engine']:.2f} (raw with the engine's "
        f"patience {PATIENCE}: {medians['raw_same_patience'] / medians['engine']:.2f})"
    )
    return medians | {"n": len(ids)}


def record(directory: str, what: str, figures: dict, args: argparse.Namespace) -> None:
    """One comparison's figures as a record, with CTranslate2's and transformers' versions."""
    peers = {"ctranslate2": package_version("ctranslate2")}
    if "hf" in args.peers and not (args.testset or args.engine or args.quantize):
        peers["transformers"] = package_version("transformers")
    if "onnx" in args.peers:
        peers["onnxruntime"] = package_version("onnxruntime")
    rec = make_record(
        topic="export" if "onnx" in args.peers else "decoding",
        what=what,
        figures=figures,
        command="benchmarks/decode_throughput.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers=peers,
        notes=f"best of {args.repeats} interleaved repeats" if not args.testset else "",
    )
    print(f"wrote {write_record(rec, directory)}")


def each_thread(threads: int) -> str:
    return "one thread each" if threads == 1 else f"{threads} threads each"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["d256", "base"], choices=list(CONFIGS))
    parser.add_argument("--n1", type=int, default=8, help="sentences decoded one at a time")
    parser.add_argument("--n32", type=int, default=64, help="sentences decoded 32 at a time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", nargs="*", default=["hf", "ct2"], choices=["hf", "ct2", "onnx"])
    parser.add_argument(
        "--model", metavar="CHECKPOINT", help="a checkpoint's model instead of --configs"
    )
    parser.add_argument(
        "--quantize", choices=["int8"], help="ours int8 vs CTranslate2 int8 (no HF)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, default=1, help="also ours with --workers N (N > 1) of the threads"
    )
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="also time our fp32 model without packed weights (aiayn.runtime.packed)",
    )
    parser.add_argument(
        "--testset", metavar="CHECKPOINT", help="time the bundled test split instead"
    )
    parser.add_argument(
        "--engine", metavar="CHECKPOINT", help="--engine ctranslate2 against raw CTranslate2"
    )
    parser.add_argument(
        "--limit", type=int, help="--testset, --engine: the first LIMIT verses (--engine: 300)"
    )
    parser.add_argument("--record", help="write the figures as records into this folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    precision = args.quantize or "fp32"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, beam {BEAM}, {precision}")
    if args.engine:
        t = engine_times(args.engine, args.limit or 300, args.repeats, args.workers)
        figures = {"engine / raw CTranslate2 speed": f"{t['raw'] / t['engine']:.2f}x"}
        figures["with the engine's patience"] = f"{t['raw_same_patience'] / t['engine']:.2f}x"
        what = f"--engine ctranslate2 against raw CTranslate2, {t['n']} test verses, " + (
            each_thread(args.threads)
        )
    elif args.testset:
        with tempfile.TemporaryDirectory() as tmp:
            t = test_split_times(
                args.testset, args.quantize, args.repeats, tmp, args.unpacked, args.limit
            )
        figures = {"ours / CTranslate2": f"{t['ct2'] / t['ours']:.2f}x"}
        figures |= {"ours s": round(t["ours"], 1), "CTranslate2 s": round(t["ct2"], 1)}
        what = f"the test split ({t['n']} verses), against CTranslate2 ({precision}), " + (
            each_thread(args.threads)
        )
    else:
        peers = [PEER_NAMES[p] for p in args.peers if not (args.quantize and p == "hf")]
        against = f"against {' and '.join(peers)}" if peers else "ours alone"
        for name, figures in synthetic(args, precision).items():
            what = f"beam {BEAM}, {name}, {against} ({precision}), {each_thread(args.threads)}"
            if args.record:
                record(args.record, what, figures, args)
        return
    if args.record:
        record(args.record, what, figures, args)


def synthetic(args: argparse.Namespace, precision: str) -> dict[str, dict[str, str]]:
    """Each config's rates, batch 1 and 32, and ours over each peer: the figures by config."""
    results: dict[str, dict[str, str]] = {}
    peers = [p for p in args.peers if not (args.quantize and p == "hf")]
    label = lambda k: "ours" if k == "aiayn" else k  # noqa: E731
    for name in [args.model] if args.model else args.configs:
        results[name] = figures = {}
        fp32 = fp32_model(name, args)
        model = for_decoding(fp32_model(name, args), args.quantize)
        srcs = sources(max(args.n1, args.n32), model.cfg.vocab_size)
        systems = {"aiayn": lambda s, b: run_ours(model, s, b)}
        if args.workers > 1:  # the threads shared among processes (aiayn.runtime.workers)
            systems[f"workers{args.workers}"] = lambda s, b: run_ours(model, s, b, args.workers)
        if args.unpacked and not args.quantize:  # the same model through F.linear (MKL), unpacked
            systems["unpacked"] = lambda s, b: run_ours(fp32, s, b)
        ct2 = None
        with tempfile.TemporaryDirectory() as tmp:
            if peers:
                hf = to_marian(fp32)
                diff = check_logits(fp32, hf, next(batches(srcs[:4], 4))[1])
                print(f"[{name}] logits ours vs HF Marian: max |diff| = {diff:.2e}")
                if "hf" in peers:
                    systems["hf"] = lambda s, b: run_hf(hf, s, b)
                if "ct2" in peers:
                    ct2_dir, vocab = ct2_model(fp32, tmp)
                    ct2 = Ct2Process(ct2_dir, "int8" if args.quantize else "float32", args.threads)
                    systems["ct2"] = lambda s, b: run_ct2(ct2, vocab, s, b)
                if "onnx" in peers:
                    graphs = onnx_model(fp32, tmp, args.quantize, args.threads)
                    systems["onnx"] = lambda s, b: run_ours(graphs, s, b)
            for size, n in ((1, args.n1), (32, args.n32)):
                rates = tokens_per_second(systems, srcs[:n], size, args.repeats)
                line = "  ".join(f"{k} {v:7.1f}" for k, v in rates.items())
                others = [k for k in rates if k != "aiayn" and not k.startswith("workers")]
                pairs = [("aiayn", b) for b in others] + [
                    (w, b) for w in rates if w.startswith("workers") for b in ["aiayn", *others]
                ]
                figures[f"ours tokens/s, batch {size}"] = round(rates["aiayn"])
                for other in others:
                    ratio = f"{rates['aiayn'] / rates[other]:.2f}x"
                    figures[f"ours / {PEER_NAMES.get(other, other)}, batch {size}"] = ratio
                ratios = "  ".join(
                    f"{label(a)}/{label(b)} {rates[a] / rates[b]:.2f}" for a, b in pairs
                )
                print(f"[{name} {precision}] batch {size:2d}: tok/s  {line}   {ratios}", flush=True)
            if ct2 is not None:
                ct2.close()
        # the headline first: ours over a peer at batch 32
        order = sorted(figures, key=lambda k: (not k.startswith("ours / "), "batch 32" not in k))
        results[name] = {k: figures[k] for k in order}
    return results


def fp32_model(name: str, args: argparse.Namespace) -> Transformer:
    """The fp32 model timed: a checkpoint's (``--model``) or a random one of ``CONFIGS``."""
    if args.model:
        from aiayn.checkpoint import load_transformer

        return load_transformer(args.model)[0].eval()
    return our_model(CONFIGS[name])


PEER_NAMES = {"ct2": "CTranslate2", "hf": "HF Marian", "onnx": "ONNX Runtime"}


if __name__ == "__main__":
    main()
