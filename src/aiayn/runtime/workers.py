"""Decoding on several CPU cores at once: ``decode_ids``'s batches shared among forked worker
processes, each with its share of the intra-op threads (``--workers N``).

A decode step at these batch sizes is mostly small operations that Python runs one after
another; only the large matmuls use a second intra-op thread, so a second thread speeds a
search up far less than a second process decoding other batches does (docs/decoding.md,
"Both cores"). This is what CTranslate2's ``inter_threads`` and Marian's ``--cpu-threads`` do.

The workers are forked once the batches are made, so they inherit the model, the sources and
the search's options: only a batch's number goes out and its hypotheses come back (nothing
else is pickled, so constraints and ensembles need not be picklable). Each worker decodes the
batches it takes exactly as one process would, longest first as they come, and the results
are put back in the batches' order, so the outputs are those of one process (with as many
threads as a worker has).

    for i, hyps in run_batches(lambda i: beam_search(model, srcs[i], config), len(srcs), workers=2):
        ...
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import torch

from ..errors import UserError

DecodeBatch = Callable[[int], Any]  # batch number -> its hypotheses

_job: DecodeBatch | None = None  # what the forked workers run: set in the parent before the fork


MAX_AUTO_WORKERS = 8  # past it a many-core machine would hold that many searches' caches at once


def auto_workers(device: torch.device | str) -> int:
    """``--workers auto`` (the commands' default): on the CPU one process per intra-op thread
    this process has, each then with one thread (at most ``MAX_AUTO_WORKERS``); one elsewhere.
    A second process beats a second thread here because a step's small operations use one
    core (docs/decoding.md, "Both cores"); ``run_batches`` keeps one or two batches here."""
    if torch.device(device).type != "cpu":
        return 1
    return max(1, min(torch.get_num_threads(), MAX_AUTO_WORKERS))


def resolve_workers(workers: int | str | None, device: torch.device | str) -> int:
    """``--workers`` (or ``Translator(workers=...)``) as a count, at least 1: "auto" (or None)
    is ``auto_workers`` on ``device``; several need the CPU."""
    if workers in (None, "auto"):
        return auto_workers(device)
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise UserError(f"--workers is a number of processes or auto, not {workers!r}")
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if workers > 1 and torch.device(device).type != "cpu":
        raise UserError(f"--workers are CPU processes: --device {device} decodes in one")
    return workers


def worker_threads(workers: int) -> int:
    """The intra-op threads each of ``workers`` processes gets: this process's, shared out."""
    return max(1, torch.get_num_threads() // workers)


def run_batches(
    decode_batch: DecodeBatch, n: int, *, workers: int = 1
) -> Iterator[tuple[int, Any]]:
    """(batch number, ``decode_batch(number)``) for batches 0..n-1, in the order they finish:
    in ``workers`` forked processes, but never more than one per two batches (with one or two
    batches, here): a process for a single batch runs it on fewer threads and then idles while
    the longest one finishes (measured in docs/decoding.md, "Both cores"). A worker that dies
    (killed, out of memory) raises ``BrokenProcessPool`` here rather than hanging."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    processes = min(workers, n // 2)
    if processes <= 1:
        for i in range(n):
            yield i, decode_batch(i)
        return
    global _job
    _job = decode_batch
    pool = ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_start,
        initargs=(worker_threads(processes),),
    )
    try:
        for future in as_completed([pool.submit(_decode, i) for i in range(n)]):
            yield future.result()
    finally:
        pool.shutdown(cancel_futures=True)  # an error or a caller that stops: no more batches
        _job = None


def _start(threads: int) -> None:
    torch.set_num_threads(threads)


def _decode(i: int) -> tuple[int, Any]:
    assert _job is not None, "run_batches sets the job before forking"
    return i, _job(i)
