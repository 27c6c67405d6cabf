"""Dynamic batching: requests that arrive close together are decoded as one batch by a single
worker thread, the only thread that touches the model.

Why: decoding one sentence at a time leaves most of each matmul idle; a batch of 32 costs
little more than a batch of one (see ``benchmarks/decode_throughput.py``). Under load the
server therefore waits at most ``max_wait_s`` after the first waiting request for others to
join it, up to ``max_cost`` (source tokens), then hands the lot to ``handle``. Requests that
arrive while a batch is decoding form the next batch, so batches grow with the load even with
no wait at all. ``max_cost=0`` turns batching off: every request is decoded alone.

Only requests with the same ``key`` (e.g. beam size and alpha) can share a decode call; a
batch with several keys is handed over as one group per key. If ``handle`` fails for a group,
each of its requests is retried alone, so a request that cannot be decoded fails by itself
and the others still get their answers. A request whose caller stopped waiting (its client hung
up, and the app cancelled the ``submit``) is dropped before it is decoded, so the requests
behind it do not wait for an answer nobody reads.

Shutting down in two steps: ``stop(drain_s)`` refuses new requests and gives the queue
``drain_s`` seconds; requests not handed to ``handle`` by then fail with ``ShuttingDown``
(the batch decoding then still finishes). ``close`` then stops the worker thread.

Why by hand: Starlette/FastAPI have no batching; the serving frameworks that do (Triton,
TorchServe, Ray Serve) are servers of their own, far heavier than this one module.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass
class _Pending(Generic[T]):
    item: T
    cost: int
    key: Hashable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    """What the worker did: how many decode calls, and how many requests the largest held."""

    requests: int = 0
    batches: int = 0
    largest: int = 0
    failures: int = 0
    cancelled: int = 0  # dropped undecoded: the caller stopped waiting


class ShuttingDown(RuntimeError):
    """``submit`` after ``stop`` or ``close``, or a request still queued at ``stop``'s deadline:
    the server will not decode it."""


_STOP = object()


class Batcher(Generic[T, R]):
    """``await batcher.submit(item)`` -> ``handle([..., item, ...])[its index]``, from one thread.

    ``handle(items)`` gets items of one key in arrival order and returns one result per item.
    ``cost(item)`` is its size in the budget ``max_cost``; an item over budget still runs, alone.
    """

    def __init__(
        self,
        handle: Callable[[list[T]], list[R]],
        *,
        cost: Callable[[T], int],
        key: Callable[[T], Hashable],
        max_cost: int,
        max_wait_s: float,
    ) -> None:
        if max_cost < 0 or max_wait_s < 0:
            raise ValueError(f"max_cost ({max_cost}) and max_wait_s ({max_wait_s}) must be >= 0")
        self.handle, self.cost, self.key = handle, cost, key
        self.max_cost, self.max_wait_s = max_cost, max_wait_s
        self.stats = BatchStats()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._deadline = float("inf")  # monotonic time after which nothing more is decoded
        self._timer: threading.Timer | None = None
        self._thread = threading.Thread(target=self._work, name="aiayn-decoder", daemon=True)
        self._thread.start()

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for its result (or the exception ``handle`` raised for it)."""
        if self._closed:
            raise ShuttingDown("the server is shutting down")
        loop = asyncio.get_running_loop()
        pending = _Pending(item, self.cost(item), self.key(item), loop, loop.create_future())
        self._queue.put(pending)
        return await pending.future

    def stop(self, drain_s: float) -> None:
        """Take no more requests; fail with ``ShuttingDown`` those not decoding in ``drain_s``.

        Returns at once: the event loop must keep running to send the answers.
        """
        self._closed = True
        if self._timer is None:
            self._deadline = time.monotonic() + drain_s
            self._timer = threading.Timer(drain_s, self._refuse_queued)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        """Finish every request still queued (unless ``stop``'s deadline passed), then stop the
        worker thread."""
        if self._timer is not None:
            self._timer.cancel()
        if self._thread.is_alive():
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()

    # --- the worker thread ------------------------------------------------------------------

    def _work(self) -> None:
        carry: _Pending | None = None  # the request that did not fit the previous batch
        stop = False
        while not stop:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                return
            if self._drop(first):
                continue
            batch, cost = [first], first.cost
            deadline = time.monotonic() + self.max_wait_s
            while True:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True  # decode what is here, then stop
                    break
                if self._drop(nxt):
                    continue
                if cost + nxt.cost > self.max_cost:
                    carry = nxt
                    break
                batch.append(nxt)
                cost += nxt.cost
            self._run(batch)

    def _drop(self, p: _Pending) -> bool:
        """Whether ``p`` is not to be decoded: its caller left, or the shutdown deadline passed."""
        if p.future.cancelled():  # set by the loop thread; a stale read costs one wasted decode
            self.stats.cancelled += 1
            return True
        if time.monotonic() >= self._deadline:
            _refuse(p)
            return True
        return False

    def _refuse_queued(self) -> None:
        """At the deadline (on the timer's thread): fail what is still queued at once, rather
        than when the batch decoding now is done."""
        stop = False
        while True:
            try:
                p = self._queue.get_nowait()
            except queue.Empty:
                break
            if p is _STOP:
                stop = True
            else:
                _refuse(p)
        if stop:  # close() is waiting for the worker to see it
            self._queue.put(_STOP)

    def _run(self, batch: list[_Pending]) -> None:
        groups: dict[Hashable, list[_Pending]] = {}
        for p in batch:
            if not self._drop(p):  # cancelled, or the deadline passed, while the batch formed
                groups.setdefault(p.key, []).append(p)
        for group in groups.values():
            self.stats.batches += 1
            self.stats.requests += len(group)
            self.stats.largest = max(self.stats.largest, len(group))
            try:
                results = self._call(group)
            except Exception as err:
                if len(group) == 1:
                    self._fail(group[0], err)
                    continue
                for p in group:  # find the request(s) at fault: each alone
                    try:
                        _settle(p, self._call([p])[0], None)
                    except Exception as alone_err:
                        self._fail(p, alone_err)
                continue
            for p, result in zip(group, results):
                _settle(p, result, None)

    def _call(self, group: list[_Pending]) -> list[R]:
        results = self.handle([p.item for p in group])
        if len(results) != len(group):
            raise RuntimeError(f"handle returned {len(results)} results for {len(group)} requests")
        return results

    def _fail(self, p: _Pending, err: Exception) -> None:
        self.stats.failures += 1
        log.error("decoding a request failed", exc_info=err)
        _settle(p, None, err)


def _refuse(p: _Pending) -> None:
    _settle(p, None, ShuttingDown("the server is shutting down; this request was not decoded"))


def _settle(p: _Pending, result: Any, err: Exception | None) -> None:
    """Hand a result to the event loop that waits for it (futures are not thread-safe)."""

    def settle() -> None:
        if p.future.done():  # the client went away and the request was cancelled
            return
        if err is not None:
            p.future.set_exception(err)
        else:
            p.future.set_result(result)

    try:
        p.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass
