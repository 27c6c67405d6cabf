"""Load on `aiayn serve` over loopback: dynamic batching on vs off, and overload.

Starts the server on 127.0.0.1 (a free port; nothing else is contacted) once per run:
"on" with the defaults (``--max-batch-tokens 4000 --max-wait-ms 5``), "off" with
``--max-batch-tokens 0`` (each request decoded alone). Each time ``--clients`` concurrent
clients send ``--requests`` requests each, one sentence per request, from the bundled test
split (verses of at most ``--max-words`` words), beam 4, alpha 0.6. Every answer is checked
against the library's ``translate`` of the same sentence (batched as ``aiayn translate``
does). Bounded: a client starts no new request after ``--max-seconds`` (the requests in flight
still finish and count).

"overload" starts the server with ``--deadline-s`` and ``--max-queue``, measures its capacity
(sentences/s) with the closed-loop clients for ``--capacity-seconds``, then offers
``--overload`` times that (requests sent at a fixed rate, each without waiting for the others)
for ``--overload-seconds``. It checks that every 200 answer is correct, that no request's
decode started past its deadline (the server's ``longest_wait_s``) and that no answer came later
than the deadline plus the longest decode call, and counts the 503s by reason.

"stream" sends one document (``--doc-verses`` test verses, ``split``) whole and streamed,
A-B-B-A: the seconds to the first sentence's line and to the last, against the whole answer's,
and checks that the lines join into the whole answer's text byte for byte.

    python benchmarks/serve_load.py --checkpoint runs/demo/averaged        # ~10 minutes
    python benchmarks/serve_load.py --checkpoint runs/demo/averaged --runs overload --threads 1
    python benchmarks/serve_load.py --checkpoint runs/demo/averaged --runs stream --record records

Prints, per run: requests answered / correct, p50 and p99 latency, sentences/s, and the
batches the server formed (requests per decode call); for overload the offered and answered
rates, the 503s, and the checks.
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
from itertools import islice
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from aiayn.checkpoint import VOCAB, load_transformer  # noqa: E402
from aiayn.data import Vocab, bundled_corpus_paths  # noqa: E402
from aiayn.data.readers import iter_lines  # noqa: E402
from aiayn.decode import DecodeConfig, SearchRequest, translate  # noqa: E402

MODES = {"on": [], "off": ["--max-batch-tokens", "0"]}  # dynamic batching on, off
SLACK_S = 1.0  # loopback, and the client's and server's event loops on a busy machine


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


async def overload(
    url: str, lines: list[str], expected: dict[str, str], rate: float, seconds: float, args
) -> dict:
    """Send one-sentence requests at ``rate`` per second for ``seconds``, none waiting for
    another; count the answers by kind and check them."""
    answers: list[tuple[int, float, str]] = []  # status (0: no answer), latency, what came
    # a new connection per request: reusing an idle keep-alive one races the server closing it
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def one(line: str) -> None:
            start = time.perf_counter()
            body = {"text": [line], "beam": args.beam, "alpha": args.alpha}
            try:
                resp = await http.post("/translate", json=body)
            except httpx.TransportError as err:
                answers.append((0, time.perf_counter() - start, f"{type(err).__name__}: {err}"))
                return
            got = resp.json()
            ok = resp.status_code == 200 and got["translations"][0]["text"] == expected[line]
            kind = "correct" if ok else str(got.get("error", "wrong"))
            answers.append((resp.status_code, time.perf_counter() - start, kind))

        tasks, begun = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, begun + i / rate - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one(lines[i % len(lines)])))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - begun
        stats = (await http.get("/health")).json()
    ok = sorted(latency for status, latency, kind in answers if kind == "correct")
    late_limit = args.deadline_s + stats["longest_decode_s"] + SLACK_S
    return {
        "offered_per_s": rate,
        "sent": len(answers),
        "ok_correct": len(ok),
        "ok_wrong": sum(status == 200 and kind != "correct" for status, _, kind in answers),
        "503_queue_full": sum(status == 503 and "waiting already" in k for status, _, k in answers),
        "503_deadline": sum(status == 503 and "deadline" in k for status, _, k in answers),
        "other": sum(status not in (200, 503) for status, _, _ in answers),
        "other_examples": sorted(
            {f"{status}: {k}" for status, _, k in answers if status not in (200, 503)}
        )[:3],
        "answered_per_s": len(ok) / elapsed,
        "p50_ok_s": ok[len(ok) // 2] if ok else None,
        "p99_ok_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "slowest_answer_s": max(latency for _, latency, _ in answers),
        "late_limit_s": late_limit,
        "longest_wait_s": stats["longest_wait_s"],
        "longest_decode_s": stats["longest_decode_s"],
        "checks_pass": stats["longest_wait_s"] <= args.deadline_s
        and all(latency <= late_limit for _, latency, _ in answers)
        and all(status == 503 or kind == "correct" for status, _, kind in answers),
    }


def closed_loop(url: str, lines: list[str], expected: dict[str, str], args, seconds: float):
    return asyncio.run(
        load(url, lines, expected, args.clients, args.requests, args.beam, args.alpha, seconds)
    )


def run_overload(lines: list[str], expected: dict[str, str], args) -> dict:
    limits = ["--deadline-s", str(args.deadline_s), "--max-queue", str(args.max_queue)]
    proc, url = start_server(args.checkpoint, limits, args.threads)
    try:
        capacity = closed_loop(url, lines, expected, args, args.capacity_seconds)
        print("capacity", json.dumps(capacity), flush=True)
        rate = args.overload * capacity["sentences_per_s"]
        result = asyncio.run(overload(url, lines, expected, rate, args.overload_seconds, args))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    print("overload", json.dumps(result), flush=True)
    return {"capacity_per_s": capacity["sentences_per_s"], **result}


def print_overload(r: dict, args) -> None:
    print(
        f"\noverload: --deadline-s {args.deadline_s:g} --max-queue {args.max_queue}; capacity "
        f"{r['capacity_per_s']:.2f} sentences/s, offered {r['offered_per_s']:.2f}/s "
        f"({args.overload:g}x) for {args.overload_seconds:g} s"
    )
    print(
        f"sent {r['sent']}: 200 correct {r['ok_correct']} (wrong {r['ok_wrong']}), "
        f"503 queue full {r['503_queue_full']}, 503 deadline {r['503_deadline']}, "
        f"other {r['other']} {r['other_examples']}; answered {r['answered_per_s']:.2f}/s"
    )
    print(
        f"200 latency p50 {r['p50_ok_s']:.2f} s, p99 {r['p99_ok_s']:.2f} s; slowest answer "
        f"{r['slowest_answer_s']:.2f} s (limit: deadline + longest decode call "
        f"{r['longest_decode_s']:.2f} s + {SLACK_S:g} s); longest wait for a decode to start "
        f"{r['longest_wait_s']:.2f} s; checks {'pass' if r['checks_pass'] else 'FAIL'}"
    )


def print_modes(results: dict, args) -> None:
    print(
        f"\ncheckpoint {args.checkpoint}, {args.clients} clients x {args.requests} requests, "
        f"beam {args.beam}, server threads {args.threads}"
    )
    print(
        f"{'batching':<9} {'answered':>9} {'correct':>8} {'p50 s':>7} {'p99 s':>7} "
        f"{'sent/s':>7} {'req/call':>8}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<9} {r['answered']:>4}/{r['planned']:<4} {r['correct']:>8} "
            f"{r['p50_s']:>7.2f} {r['p99_s']:>7.2f} {r['sentences_per_s']:>7.2f} "
            f"{r['requests_per_call']:>8.1f}"
        )


async def streamed(url: str, body: dict) -> tuple[float, float, str]:
    """Seconds to the first sentence's line and to the last line, and the text they join into."""
    start, first, deltas = time.perf_counter(), 0.0, []
    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
        async with http.stream("POST", "/translate", json={**body, "stream": True}) as resp:
            async for line in resp.aiter_lines():
                got = json.loads(line)
                if "error" in got:
                    raise SystemExit(f"stream: {got}")
                first = first or (time.perf_counter() - start if "sentence" in got else 0.0)
                deltas.append(got.get("delta", ""))
    return first, time.perf_counter() - start, "".join(deltas)


def run_stream(args: argparse.Namespace) -> dict:
    src, _ = bundled_corpus_paths()["test"]
    body = {"text": [" ".join(islice(iter_lines(src), args.doc_verses))], "split": True}
    body |= {"beam": args.beam, "alpha": args.alpha}
    limits = ["--max-chars", "1000000", "--max-sentences", "100000"]
    proc, url = start_server(args.checkpoint, limits, args.threads)
    whole_s, first_s, stream_s, same = [], [], [], True
    try:
        for mode in ("whole", "stream", "stream", "whole"):  # A-B-B-A
            if mode == "whole":
                start = time.perf_counter()
                answer = httpx.post(url + "/translate", json=body, timeout=None).json()
                whole_s.append(time.perf_counter() - start)
                [document] = answer["translations"]
            else:
                first, total, text = asyncio.run(streamed(url, body))
                first_s, stream_s = first_s + [first], stream_s + [total]
                same = same and text == document["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    result = {"sentences": len(document["sentences"]), "same_bytes": same}
    result |= {"first_s": min(first_s), "stream_s": min(stream_s), "whole_s": min(whole_s)}
    print("stream", json.dumps(result), flush=True)
    return result


def record_stream(r: dict, args: argparse.Namespace) -> None:
    from aiayn.records import make_record, package_version, write_record

    rec = make_record(
        topic="serving",
        what=f"`aiayn serve`, a document of {r['sentences']} sentences streamed",
        figures={
            "first sentence / whole answer": f"{r['first_s'] / r['whole_s']:.3f}",
            "first sentence": f"{r['first_s']:.2f} s",
            "stream / whole": f"{r['stream_s']:.1f} / {r['whole_s']:.1f} s",
            "same bytes": "yes" if r["same_bytes"] else "NO",
        },
        command="benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={"uvicorn": package_version("uvicorn")},
        notes=f"beam {args.beam}, split, the best of 2 A-B-B-A, {args.checkpoint}",
    )
    print(f"wrote {write_record(rec, args.record)}")


def record(results: dict, args: argparse.Namespace) -> None:
    """Dynamic batching on against off as a record (``aiayn.records``, topic serving)."""
    from aiayn.records import make_record, package_version, write_record

    on, off = results["on"], results["off"]
    rec = make_record(
        topic="serving",
        what=f"`aiayn serve`, {args.clients} clients, dynamic batching on / off",
        figures={
            "on / off": f"{on['sentences_per_s'] / off['sentences_per_s']:.1f}x",
            "sentences/s": f"{on['sentences_per_s']:.2f} / {off['sentences_per_s']:.2f}",
            "p50": f"{on['p50_s']:.1f} / {off['p50_s']:.1f} s",
            "p99": f"{on['p99_s']:.1f} / {off['p99_s']:.1f} s",
        },
        command="benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={"uvicorn": package_version("uvicorn")},
        notes=f"beam {args.beam}, {args.requests} requests a client, {args.checkpoint}",
    )
    print(f"wrote {write_record(rec, args.record)}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", default="runs/demo/averaged")
    runs = [*MODES, "overload", "stream"]
    p.add_argument("--runs", nargs="+", choices=runs, default=runs)
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
    p.add_argument("--deadline-s", type=float, default=10.0, help="overload: the server's")
    p.add_argument("--max-queue", type=int, default=64, help="overload: the server's")
    p.add_argument("--overload", type=float, default=3.0, help="offered load / capacity")
    p.add_argument("--capacity-seconds", type=float, default=60.0)
    p.add_argument("--overload-seconds", type=float, default=120.0)
    p.add_argument("--doc-verses", type=int, default=180, help="stream: the document's verses")
    p.add_argument("--record", help="write the on/off comparison as a record into this folder")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    lines = sentences(args.sentences, args.max_words)
    t, steady = time.perf_counter(), [args.checkpoint, lines, args.beam, args.alpha, args.threads]
    expected = expected_translations(*steady) if set(args.runs) - {"stream"} else {}
    print(
        f"{len(lines)} distinct sentences; reference translations in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    results = {}
    for mode in [m for m in MODES if m in args.runs]:
        proc, url = start_server(args.checkpoint, MODES[mode], args.threads)
        try:
            results[mode] = closed_loop(url, lines, expected, args, args.max_seconds)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        print(mode, json.dumps(results[mode]), flush=True)
    shed = run_overload(lines, expected, args) if "overload" in args.runs else None
    stream = run_stream(args) if "stream" in args.runs else None
    if results:
        print_modes(results, args)
    if args.record and {"on", "off"} <= set(results):
        record(results, args)
    if stream is not None and args.record:
        record_stream(stream, args)
    if shed is not None:
        print_overload(shed, args)
        if not shed["checks_pass"]:
            raise SystemExit("overload: a check failed (see above)")
    if stream is not None and not stream["same_bytes"]:
        raise SystemExit("stream: the lines do not join into the whole answer's text")


if __name__ == "__main__":
    main()
