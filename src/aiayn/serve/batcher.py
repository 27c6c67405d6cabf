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
the group is split in halves and each half retried, down to the request at fault: one bad
request among n costs about ``2 log2 n`` extra decode calls, not n, and fails by itself while
the others get their answers.

Shedding load rather than queueing without end: at most ``max_queue`` requests wait (a
request beyond that fails at once with ``QueueFull``), and a request whose decode has not
started ``deadline_s`` after it arrived fails with ``DeadlinePassed``, undecoded, at that
moment. Both carry ``retry_after_s``: the last decode call's duration, about when room frees
up. A request whose caller stopped waiting (its client hung up, and the app cancelled the
``submit``) is taken out of the queue, so the requests behind it do not wait for an answer
nobody reads. Each request moves through ``_State`` under one lock, so exactly one of the
worker (decode it) and the event loop (its deadline, its cancellation) decides its fate.

Shutting down in two steps: ``stop(drain_s)`` refuses new requests and gives the queue
``drain_s`` seconds; requests not handed to ``handle`` by then fail with ``ShuttingDown``
(the batch decoding then still finishes). ``close`` then stops the worker thread.

Why by hand: Starlette/FastAPI have no batching; the serving frameworks that do (Triton,
TorchServe, Ray Serve) are servers of their own, far heavier than this one module.
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _State(enum.Enum):
    QUEUED = "waiting in the queue"
    CLAIMED = "in a batch, waiting for its group's decode call"
    DECODING = "handed to handle"
    GONE = "answered without a decode: expired, cancelled or refused"


@dataclass(eq=False)
class _Pending(Generic[T]):
    item: T
    cost: int
    key: Hashable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)
    arrived: float  # time.monotonic()
    expires: float
    state: _State = _State.QUEUED


@dataclass
class BatchStats:
    """What the worker did: decode calls, requests decoded and the most in one call, and the
    requests answered without a decode (each by its reason)."""

    requests: int = 0
    batches: int = 0
    largest: int = 0
    failures: int = 0
    cancelled: int = 0  # dropped undecoded: the caller stopped waiting
    rejected: int = 0  # refused at once: the queue was full
    expired: int = 0  # dropped undecoded: the deadline passed before its decode started
    longest_wait_s: float = 0.0  # arrival to the start of its decode, over decoded requests
    longest_decode_s: float = 0.0  # one call of ``handle``


class ShuttingDown(RuntimeError):
    """``submit`` after ``stop`` or ``close``, or a request still queued at ``stop``'s deadline:
    the server will not decode it."""


class Overloaded(RuntimeError):
    """The server sheds this request undecoded; ``retry_after_s``: when to try again."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(Overloaded):
    """``max_queue`` requests were already waiting."""


class DeadlinePassed(Overloaded):
    """The request waited ``deadline_s`` without its decode starting."""


class Batcher(Generic[T, R]):
    """``await batcher.submit(item)`` -> ``handle([..., item, ...])[its index]``, from one thread.

    ``handle(items)`` gets items of one key in arrival order and returns one result per item.
    ``cost(item)`` is its size in the budget ``max_cost``; an item over budget still runs, alone.
    ``max_queue``: requests waiting at most (0: no bound); ``deadline_s``: how long one may
    wait for its decode to start (``inf``: no deadline).
    """

    def __init__(
        self,
        handle: Callable[[list[T]], list[R]],
        *,
        cost: Callable[[T], int],
        key: Callable[[T], Hashable],
        max_cost: int,
        max_wait_s: float,
        max_queue: int = 0,
        deadline_s: float = math.inf,
    ) -> None:
        if min(max_cost, max_wait_s, max_queue) < 0 or not deadline_s > 0:
            raise ValueError(
                f"max_cost ({max_cost}), max_wait_s ({max_wait_s}) and max_queue ({max_queue}) "
                f"must be >= 0, deadline_s ({deadline_s}) > 0"
            )
        self.handle, self.cost, self.key = handle, cost, key
        self.max_cost, self.max_wait_s = max_cost, max_wait_s
        self.max_queue, self.deadline_s = max_queue, deadline_s
        self.stats = BatchStats()
        self._queue: deque[_Pending] = deque()  # QUEUED requests only, in arrival order
        self._lock = threading.Condition()  # guards the queue, every state and the stats
        self._closed = False  # no new requests
        self._stopping = False  # the worker ends once the queue is empty
        self._drain_deadline = math.inf  # monotonic time after which nothing more is decoded
        self._last_decode_s = 0.0
        self._timer: threading.Timer | None = None
        self._thread = threading.Thread(target=self._work, name="aiayn-decoder", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests queued, not yet taken into a batch."""
        with self._lock:
            return len(self._queue)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for its result (or the exception ``handle`` raised for it);
        ``QueueFull`` or ``DeadlinePassed`` when the server sheds it."""
        loop = asyncio.get_running_loop()
        arrived = time.monotonic()
        p = _Pending(
            item,
            self.cost(item),
            self.key(item),
            loop,
            future=loop.create_future(),
            arrived=arrived,
            expires=arrived + self.deadline_s,
        )
        self._enqueue(p)
        timer = None
        if self.deadline_s < math.inf:
            timer = loop.call_later(self.deadline_s, self._expire, p)
        try:
            return await p.future
        except asyncio.CancelledError:
            with self._lock:
                if self._withdraw(p):
                    self.stats.cancelled += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def stop(self, drain_s: float) -> None:
        """Take no more requests; fail with ``ShuttingDown`` those not decoding in ``drain_s``.

        Returns at once: the event loop must keep running to send the answers.
        """
        with self._lock:
            self._closed = True
            if self._timer is not None:
                return
            self._drain_deadline = time.monotonic() + drain_s
            self._timer = threading.Timer(drain_s, self._refuse_queued)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        """Finish every request still queued (unless ``stop``'s deadline passed), then stop the
        worker thread."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = self._stopping = True
            self._lock.notify()
        self._thread.join()

    # --- the event loop's side --------------------------------------------------------------

    def _enqueue(self, p: _Pending) -> None:
        with self._lock:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            if self.max_queue and len(self._queue) >= self.max_queue:
                self.stats.rejected += 1
                raise QueueFull(
                    f"the server is overloaded: {self.max_queue} requests are waiting already",
                    self._retry_after_s(),
                )
            self._queue.append(p)
            self._lock.notify()

    def _withdraw(self, p: _Pending) -> bool:
        """Take ``p`` out before its decode starts (with the lock held); False if too late."""
        if p.state is _State.QUEUED:
            self._queue.remove(p)
        elif p.state is not _State.CLAIMED:
            return False
        p.state = _State.GONE
        return True

    def _expire(self, p: _Pending) -> None:
        """At ``p``'s deadline (on its loop): fail it unless its decode has started."""
        with self._lock:
            if not self._withdraw(p):
                return
            self.stats.expired += 1
            err = self._deadline_passed()
        if not p.future.done():
            p.future.set_exception(err)

    def _deadline_passed(self) -> DeadlinePassed:
        return DeadlinePassed(
            f"the server is overloaded: this request waited {self.deadline_s:g} s, its deadline, "
            "and was not decoded",
            self._retry_after_s(),
        )

    def _retry_after_s(self) -> int:
        """About when a place frees up: once the decode call now running is done."""
        return max(1, math.ceil(self._last_decode_s))

    # --- the worker thread ------------------------------------------------------------------

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            groups: dict[Hashable, list[_Pending]] = {}
            for p in batch:
                groups.setdefault(p.key, []).append(p)
            for group in groups.values():
                if started := self._start(group):
                    self._decode(started)

    def _next_batch(self) -> list[_Pending] | None:
        """Wait for a request, then up to ``max_wait_s`` for others within ``max_cost``; take
        them out of the queue (CLAIMED). None once stopping with nothing queued."""
        with self._lock:
            while not self._queue and not self._stopping:
                self._lock.wait()
            if not self._queue:
                return None
            batch = [self._claim()]
            cost, window_end = batch[0].cost, time.monotonic() + self.max_wait_s
            while True:
                if self._queue:
                    if self.max_cost == 0 or cost + self._queue[0].cost > self.max_cost:
                        return batch
                    cost += self._queue[0].cost
                    batch.append(self._claim())
                    continue
                left = window_end - time.monotonic()
                if left <= 0 or self._stopping:
                    return batch
                self._lock.wait(left)

    def _claim(self) -> _Pending:
        p = self._queue.popleft()
        p.state = _State.CLAIMED
        return p

    def _start(self, group: list[_Pending]) -> list[_Pending]:
        """The members of ``group`` to decode now: not expired, cancelled, or past the
        shutdown's deadline (those are answered here)."""
        now, started = time.monotonic(), []
        with self._lock:
            for p in group:
                if p.state is not _State.CLAIMED:
                    continue  # its deadline or its cancellation came first, on the loop
                if now >= self._drain_deadline:
                    p.state = _State.GONE
                    _refuse(p)
                elif now >= p.expires:  # the loop has not yet run its timer
                    p.state = _State.GONE
                    self.stats.expired += 1
                    _settle(p, None, self._deadline_passed())
                else:
                    p.state = _State.DECODING
                    self.stats.longest_wait_s = max(self.stats.longest_wait_s, now - p.arrived)
                    started.append(p)
            if started:
                self.stats.batches += 1
                self.stats.requests += len(started)
                self.stats.largest = max(self.stats.largest, len(started))
        return started

    def _decode(self, group: list[_Pending]) -> None:
        """Answer ``group``; if ``handle`` fails, bisect it to find the request(s) at fault."""
        try:
            results = self._call(group)
        except Exception as err:
            if len(group) == 1:
                with self._lock:
                    self.stats.failures += 1
                _settle(group[0], None, err)
                return
            half = len(group) // 2
            self._decode(group[:half])
            self._decode(group[half:])
            return
        for p, result in zip(group, results):
            _settle(p, result, None)

    def _call(self, group: list[_Pending]) -> list[R]:
        start = time.monotonic()
        try:
            results = self.handle([p.item for p in group])
        finally:
            took = time.monotonic() - start
            with self._lock:
                self._last_decode_s = took
                self.stats.longest_decode_s = max(self.stats.longest_decode_s, took)
        if len(results) != len(group):
            raise RuntimeError(f"handle returned {len(results)} results for {len(group)} requests")
        return results

    def _refuse_queued(self) -> None:
        """At the drain deadline (on the timer's thread): fail what is still queued at once,
        rather than when the batch decoding now is done."""
        with self._lock:
            while self._queue:
                p = self._queue.popleft()
                p.state = _State.GONE
                _refuse(p)


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
