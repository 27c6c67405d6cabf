"""Load on `aiayn serve` over loopback: dynamic batching on vs off.

Starts the server twice on 127.0.0.1 (a free port; nothing else is contacted): once with the
defaults (``--max-batch-tokens 4000 --max-wait-ms 5``) and once with ``--max-batch-tokens 0``
(each request decoded alone). Each time ``--clients`` concurrent clients send ``--requests``
requests each, one sentence per request, from the bundled test split (verses of at most
``--max-words`` words), beam 4, alpha 0.6. Every answer is checked against the library's
``translate`` of the same sentence (batched as ``aiayn translate`` does). Bounded: a client
starts no new request after ``--max-seconds`` (the requests in flight still finish and count).

    python benchmarks/serve_load.py --checkpoint runs/demo/averaged        # 32 x 50, ~minutes
    python benchmarks/serve_load.py --checkpoint runs/demo/averaged --requests 5 --threads 1

Prints, per mode: requests answered / correct, p50 and p99 latency, sentences/s, and the
batches the server formed (requests per decode call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from aiayn.checkpoint import VOCAB, load_transformer  # noqa: E402
from aiayn.data import Vocab, bundled_corpus_paths  # noqa: E402
from aiayn.data.readers import iter_lines  # noqa: E402
from aiayn.decode import DecodeConfig, SearchRequest, translate  # noqa: E402

MODES = {"batching on": [], "batching off": ["--max-batch-tokens", "0"]}


def sentences(n: int, max_words: int) -> list[str]:
    src, _ = bundled_corpus_paths()["test"]
    return [line for line in iter_lines(src) if 0 < len(line.split()) <= max_words][:n]


def expected_translations(
    checkpoint: str, lines: list[str], beam: int, alpha: float, threads: int
) -> dict[str, str]:
    import torch

    torch.set_num_threads(threads)
    model, _ = load_transformer(checkpoint)
    vocab = Vocab.load(Path(checkpoint) / VOCAB)
    outputs = translate(model, lines, vocab, SearchRequest(DecodeConfig(beam=beam, alpha=alpha)))
    return dict(zip(lines, outputs))


def start_server(checkpoint: str, args: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiayn",
            "serve",
            "--checkpoint",
            checkpoint,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


async def load(
    url: str,
    lines: list[str],
    expected: dict[str, str],
    clients: int,
    requests: int,
    beam: int,
    alpha: float,
    max_seconds: float,
) -> dict:
    latencies: list[float] = []
    wrong, errors = [], []
    deadline = time.monotonic() + max_seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def client(c: int) -> None:
            for r in range(requests):
                if time.monotonic() > deadline:
                    return
                line = lines[(c * requests + r) % len(lines)]
                start = time.perf_counter()
                resp = await http.post(
                    "/translate", json={"text": [line], "beam": beam, "alpha": alpha}
                )
                latencies.append(time.perf_counter() - start)
                if resp.status_code != 200:
                    errors.append(f"{resp.status_code}: {resp.text[:200]}")
                elif resp.json()["translations"][0]["text"] != expected[line]:
                    wrong.append(line)

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        elapsed = time.perf_counter() - started
        stats = (await http.get("/health")).json()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return {
        "answered": len(latencies),
        "planned": clients * requests,
        "correct": len(latencies) - len(wrong) - len(errors),
        "errors": errors[:3],
        "wrong": wrong[:3],
        "p50_s": pick(0.50),
        "p99_s": pick(0.99),
        "sentences_per_s": len(latencies) / elapsed,
        "elapsed_s": elapsed,
        "decode_calls": stats["batches"],
        "largest_batch": stats["largest"],
        "requests_per_call": stats["requests"] / max(1, stats["batches"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", default="runs/demo/averaged")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=50, help="per client")
    p.add_argument(
        "--sentences", type=int, default=200, help="distinct test sentences cycled through"
    )
    p.add_argument("--max-words", type=int, default=12)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument(
        "--threads", type=int, default=2, help="the server's intra-op threads (OMP_NUM_THREADS)"
    )
    p.add_argument(
        "--max-seconds", type=float, default=600, help="per mode: no new requests after this"
    )
    args = p.parse_args()

    lines = sentences(args.sentences, args.max_words)
    t = time.perf_counter()
    expected = expected_translations(args.checkpoint, lines, args.beam, args.alpha, args.threads)
    print(
        f"{len(lines)} distinct sentences; reference translations in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    results = {}
    for mode, server_args in MODES.items():
        proc, url = start_server(args.checkpoint, server_args, args.threads)
        try:
            results[mode] = asyncio.run(
                load(
                    url,
                    lines,
                    expected,
                    args.clients,
                    args.requests,
                    args.beam,
                    args.alpha,
                    args.max_seconds,
                )
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        print(mode, json.dumps(results[mode]), flush=True)
    print(
        f"\ncheckpoint {args.checkpoint}, {args.clients} clients x {args.requests} requests, beam {args.beam}, "
        f"server threads {args.threads}"
    )
    print(
        f"{'mode':<13} {'answered':>9} {'correct':>8} {'p50 s':>7} {'p99 s':>7} {'sent/s':>7} {'req/call':>8}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<13} {r['answered']:>4}/{r['planned']:<4} {r['correct']:>8} {r['p50_s']:>7.2f} "
            f"{r['p99_s']:>7.2f} {r['sentences_per_s']:>7.2f} {r['requests_per_call']:>8.1f}"
        )


if __name__ == "__main__":
    main()
