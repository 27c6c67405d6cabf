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
and the others still get their answers.

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


class ShuttingDown(RuntimeError):
    """``submit`` after ``close``: the server no longer takes requests."""


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

    def close(self) -> None:
        """Finish every request already queued, then stop the worker thread."""
        if not self._closed:
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
                if cost + nxt.cost > self.max_cost:
                    carry = nxt
                    break
                batch.append(nxt)
                cost += nxt.cost
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
        groups: dict[Hashable, list[_Pending]] = {}
        for p in batch:
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
