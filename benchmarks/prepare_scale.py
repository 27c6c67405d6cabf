"""`aiayn prepare` at WMT scale: wall time, pairs per second and peak memory for growing
synthetic corpora, binarised by one worker and by several (``--workers``).

    python benchmarks/prepare_scale.py [--sizes 0.1M,1M,5M] [--workers 1,2] [--vocab-size 8000] [--dir /tmp]

Each corpus is the bundled training split (27,959 pairs) repeated, every copy shuffled
(seed 0), and cut to the size; it is written to a temporary directory under ``--dir`` and
removed after its runs. ``python -m aiayn prepare`` runs in a child process: once whole, the
vocabulary trained and binarised by the first worker count, then once per worker count with
that vocabulary given (``--vocab``), so that those rows time binarising alone; their files
are checked byte for byte against the first run's. CPU seconds (user and system, of the
child and its workers) say what the work costs where other jobs share the cores and wall
times say little. Peak memory twice: of the largest single process (``os.wait4``'s
``ru_maxrss``, which covers the reaped workers) and of all of them together, sampled from
/proc every 0.2 s. The goals (issues 12 and 42): time linear in the number of pairs, peak
memory flat, ``--workers 2`` binarising >= 1.7x faster than one on 2 quiet cores.
Run it with another ``PYTHONPATH`` to measure another version of the code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from aiayn.data import bundled_corpus_paths, read_parallel


def parse_size(text: str) -> int:
    """ "0.1M" -> 100000, "100k" -> 100000, "2500" -> 2500."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def write_corpus(pairs: list[tuple[str, str]], n: int, src: Path, tgt: Path, seed: int = 0) -> int:
    """Write the first ``n`` pairs of shuffled copies of ``pairs``; returns the bytes written."""
    rng, order, left = random.Random(seed), list(range(len(pairs))), n
    with open(src, "w", encoding="utf-8") as fs, open(tgt, "w", encoding="utf-8") as ft:
        while left > 0:
            rng.shuffle(order)
            chosen = order[:left]
            fs.write("".join(pairs[i][0] + "\n" for i in chosen))
            ft.write("".join(pairs[i][1] + "\n" for i in chosen))
            left -= len(chosen)
    return src.stat().st_size + tgt.stat().st_size


def tree_rss_kib(pid: int) -> int:
    """Resident KiB of ``pid`` and all its descendants now (0 for a process already gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(
                (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")),
                0,
            )
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class TreeMemory:
    """Samples ``tree_rss_kib(pid)`` every ``interval`` seconds until ``stop``; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_prepare(cmd: list[str]) -> dict[str, float]:
    """Wall seconds, peak RSS (MB: largest process, and all processes) and prepare's own
    timings, from ``python -m aiayn prepare`` with ``cmd`` in a child process."""
    cmd = [sys.executable, "-m", "aiayn", "prepare", *cmd]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        memory = TreeMemory(child.pid)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, and its workers'
        wall = time.perf_counter() - start
        memory.stop()
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
        if child.returncode != 0:
            stderr.seek(0)
            raise SystemExit(
                f"prepare failed ({child.returncode}): {' '.join(cmd)}\n{stderr.read()}"
            )
        stdout.seek(0)
        summary = json.loads(stdout.read())
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,  # the workers' too: the pool reaps them
        "rss_mb": usage.ru_maxrss / 1024,  # Linux reports KiB
        "tree_mb": memory.peak_kib / 1024,
        "vocab": summary["seconds"]["vocab"],
        "binarise": summary["seconds"]["total"] - summary["seconds"]["vocab"],
        "kept": summary["splits"]["train"]["pairs"],
    }


def arrays(dataset: Path) -> dict[str, str]:
    """{file: sha256} of the dataset's arrays, read a block at a time: this process stays small,
    and the children it forks next start no larger (their peak RSS counts from the fork)."""
    digests = {}
    for path in sorted(dataset.glob("*.npy")):
        with open(path, "rb") as f:
            digests[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def measure_size(base: list[tuple[str, str]], n: int, args: argparse.Namespace) -> dict:
    """One corpus of ``n`` pairs: prepared whole once (the vocabulary trained), then binarised
    once per worker count with that vocabulary; prints a row for each run and returns the
    figures of the whole preparation and of binarising with the most workers."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        src, tgt = Path(tmp) / "train.en", Path(tmp) / "train.es"
        size = write_corpus(base, n, src, tgt)
        common = ["--train-src", str(src), "--train-tgt", str(tgt), "--max-len", str(args.max_len)]
        full, rows = Path(tmp) / "full", []
        train = ["--vocab-size", str(args.vocab_size), "--out", str(full)]
        rows.append(
            (
                "trained",
                args.workers[0],
                run_prepare([*common, *train, "--workers", str(args.workers[0])]),
                "(reference)",
            )
        )
        for workers in args.workers:
            out = Path(tmp) / f"given{workers}"
            given = ["--vocab", str(full / "spm.model"), "--out", str(out)]
            r = run_prepare([*common, *given, "--workers", str(workers)])
            rows.append(("given", workers, r, "yes" if arrays(out) == arrays(full) else "NO"))
            shutil.rmtree(out)
        one = rows[1][2]["binarise"]  # the first worker count's, binarising alone
        for vocab, workers, r, same in rows:
            print(
                f"| {n:,} | {size / 1e6:,.0f} | {vocab} | {workers} | {r['vocab']:,.1f} | "
                f"{r['binarise']:,.1f} | {n / r['binarise']:,.0f} | {one / r['binarise']:.2f}x | "
                f"{r['wall']:,.1f} | {r['cpu']:,.1f} | {r['rss_mb']:,.0f} | {r['tree_mb']:,.0f} | "
                f"{same} |",
                flush=True,
            )
    trained, last = rows[0][2], rows[-1]
    return {
        "pairs/s, prepared whole": round(n / trained["wall"]),
        f"binarised pairs/s, {last[1]} worker(s)": round(n / last[2]["binarise"]),
        "peak RSS MB, all processes": round(max(r["tree_mb"] for _, _, r, _ in rows)),
        "files as the first's": "yes" if all(r[3] != "NO" for r in rows) else "NO",
    }


def record(n: int, figures: dict, args: argparse.Namespace) -> None:
    """One corpus size's figures as a record (``aiayn.records``, topic data)."""
    from aiayn.records import make_record, write_record

    rec = make_record(
        topic="data",
        what=f"`aiayn prepare`, {n:,} synthetic pairs, {args.vocab_size:,}-piece vocabulary",
        figures=figures,
        command="benchmarks/prepare_scale.py " + " ".join(sys.argv[1:]),
        threads=max(args.workers),
        notes=f"load average {os.getloadavg()[0]:.1f} at the end",
    )
    print(f"wrote {write_record(rec, args.record)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="0.1M,1M,5M", help="comma-separated pair counts (k, M suffixes)"
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="comma-separated worker counts; the first trains the vocabulary",
    )
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument(
        "--dir", default=None, help="where the temporary corpora go (default: $TMPDIR)"
    )
    parser.add_argument("--record", help="write each size's figures as a record into this folder")
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    base, _ = read_parallel(*bundled_corpus_paths()["train"])
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        f"vocab {args.vocab_size}, max_len {args.max_len}",
        flush=True,
    )
    print(
        "| pairs | text MB | vocabulary | workers | vocabulary s | binarise s | binarised pairs/s "
        "| binarise speed-up | prepare s (wall) | CPU s, all processes | peak RSS MB, largest "
        "process | peak RSS MB, all processes | files as the first's |"
    )
    print("|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|", flush=True)
    for n in (parse_size(s) for s in args.sizes.split(",")):
        figures = measure_size(base, n, args)
        if args.record:
            record(n, figures, args)
    print(f"load average {os.getloadavg()[0]:.1f} at the end (other jobs share the machine)")


if __name__ == "__main__":
    main()
