"""Dynamic batcher for local engines: gather concurrent items, run whole batches, split back.

Items are grouped into length buckets so one long input does not pad a batch of short ones. The
engine runs in one worker thread; while it runs, the next batch gathers. Adaptive mode sizes the
wait from the observed arrival rate and run time, and does not wait at all when traffic is light.

Fairness: a request's items in a bucket are due one batch's worth per turn from the turn it
arrived in, and the item due first goes first. The clock is the work being run: an item queued
while turn t runs is due on turn t + 1. So work that arrives later (a long request's tail, a
bucket that others keep full) never holds an item back for more than the runs already due before
it, and a request owed runs it has not had yet is not ahead of everything sent after it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry

from backends.errors import EngineError
from backends.local.metrics import LocalMetrics
from backends.settings import BatcherSettings

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: T
    length: int
    future: asyncio.Future[R]
    enqueued: float = field(default_factory=time.perf_counter)


# (turn, arrival order, item): a bucket is a heap, so the item due first is at its head.
_Entry = tuple[int, int, _Pending[T, R]]


class _Rates:
    """EWMAs of the arrival rate (items/s) and of the engine's run time per batch and per item."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.last_arrival = 0.0
        self.gap = 1.0  # seconds between arrivals; starts "light"
        self.run_fixed = 0.0
        self.run_per_item = 0.0

    def arrival(self, now: float) -> None:
        if self.last_arrival:
            self.gap += self.alpha * (min(now - self.last_arrival, 1.0) - self.gap)
        self.last_arrival = now

    def ran(self, size: int, seconds: float) -> None:
        if size == 1 or not self.run_fixed:
            self.run_fixed += self.alpha * (seconds / size - self.run_fixed)
        else:
            per_item = max(0.0, (seconds - self.run_fixed) / (size - 1))
            self.run_per_item += self.alpha * (per_item - self.run_per_item)

    def run_time(self, size: int) -> float:
        return self.run_fixed + self.run_per_item * max(0, size - 1)


class Batcher(Generic[T, R]):
    """submit(items) → results in the same order; `run` sees whole batches in a worker thread."""

    def __init__(
        self,
        name: str,
        run: Callable[[list[T]], Sequence[R]],
        settings: BatcherSettings,
        *,
        length: Callable[[T], int] | None = None,
        registry: CollectorRegistry | None = None,
        metrics: LocalMetrics | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self._run = run
        self._length = length or (lambda _: 1)
        if metrics is None:
            metrics = LocalMetrics(registry if registry is not None else CollectorRegistry())
        self._m_size = metrics.batch_size.labels(name)
        self._m_delay = metrics.queue_delay.labels(name)
        self._m_pad = metrics.padding_ratio.labels(name)
        self._m_run = metrics.run_seconds.labels(name)
        self._m_wait = metrics.wait_target.labels(name)
        self._edges = sorted(settings.buckets)
        self._queues: list[list[_Entry[T, R]]] = [[] for _ in range(len(self._edges) + 1)]
        self._queued = 0
        self._turn = 0  # one past the turn of the work run last: the clock turns count on
        self._seq = 0  # arrival order, to break ties between items due on the same turn
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lg-batch-{name}")
        self._rates = _Rates()
        self._closed = False
        # An engine run started by submit itself (the idle path), which queued work waits out
        self._inflight: asyncio.Future[Sequence[R]] | None = None
        self._batching = False  # the gathering task's batch is in the engine

    async def submit(self, items: Sequence[T]) -> list[R]:
        if self._closed:
            raise EngineError(f"engine {self.name} is shut down")
        loop = asyncio.get_running_loop()
        if not self.settings.enabled:
            return await self._run_direct(loop, list(items))
        now = time.perf_counter()
        if self._idle(loop, items):
            return await self._run_now(loop, list(items), now)
        if self._task is None or self._task.get_loop() is not loop or self._task.done():
            self._bind(loop)
        pending = []
        per_bucket = [0] * len(self._queues)
        size = self.settings.max_batch
        for item in items:
            n = self._length(item)
            p: _Pending[T, R] = _Pending(item, n, loop.create_future(), now)
            b = bisect.bisect_left(self._edges, n)
            # A request larger than a batch is taken as if its batches arrived one per run:
            # what other callers send meanwhile is interleaved instead of queued behind it all.
            turn = self._turn + per_bucket[b] // size
            per_bucket[b] += 1
            self._seq += 1
            heapq.heappush(self._queues[b], (turn, self._seq, p))
            self._rates.arrival(now)
            pending.append(p)
        self._queued += len(pending)
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(p.future for p in pending)))
        except BaseException:
            for p in pending:
                p.future.cancel()
            raise

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """(Re)start the gathering task on this loop: a long-lived encoder may outlive a loop."""
        for q in self._queues:  # items of a finished loop can never be answered
            q.clear()
        self._queued = 0
        self._batching = False  # (a batch of a finished loop's task)
        if self._inflight is not None and self._inflight.get_loop() is not loop:
            self._inflight = None  # a finished loop's run: nothing here can wait for it
        # (one of this loop's, the first lone run before the gathering task, is waited out)
        self._wakeup = asyncio.Event()
        self._task = loop.create_task(self._loop(), name=f"batcher-{self.name}")

    def _idle(self, loop: asyncio.AbstractEventLoop, items: Sequence[T]) -> bool:
        """Nothing queued or running, and the adaptive wait says no company is coming: the
        items run at once from the caller's own task. Through the gathering task the same run
        takes three more event-loop turns (its wake-up, its resumption, the callers' futures):
        about 0.1 ms of an 8 ms one-sentence embed on a quiet 2-core VM (docs/benchmarks.md,
        seventeenth session); the worker thread's own hop, 0.45 ms there, remains. Only items of
        one length bucket: mixed ones would pad the short to the long in one run, where the
        gathering task runs each bucket apart."""
        if not (
            self._queued == 0
            and self._inflight is None
            and not self._batching  # what comes during a batch gathers behind it
            and 0 < len(items) <= self.settings.max_batch
            and (self._task is None or self._task.get_loop() is loop)
            and self._wait_s() == 0.0
        ):
            return False
        buckets = {bisect.bisect_left(self._edges, self._length(i)) for i in items}
        return len(buckets) == 1

    async def _run_now(
        self, loop: asyncio.AbstractEventLoop, items: list[T], now: float
    ) -> list[R]:
        for _ in items:
            self._rates.arrival(now)
            self._m_delay.observe(0.0)
        # a turn like any batch's: what arrives meanwhile is due after it, and waits it out
        self._turn += 1
        fut = loop.run_in_executor(self._pool, self._run, items)
        self._inflight = fut
        # cleared when the run ends, even if this caller is cancelled before
        fut.add_done_callback(self._run_now_done)
        results = await fut
        if len(results) != len(items):
            raise EngineError(f"engine {self.name} returned {len(results)} for {len(items)}")
        elapsed = time.perf_counter() - now
        self._rates.ran(len(items), elapsed)
        self._observe(len(items), [self._length(i) for i in items], elapsed)
        return list(results)

    def _run_now_done(self, fut: asyncio.Future[Sequence[R]]) -> None:
        if self._inflight is fut:
            self._inflight = None
        if self._queued:
            self._wakeup.set()

    async def _run_direct(self, loop: asyncio.AbstractEventLoop, items: list[T]) -> list[R]:
        t0 = time.perf_counter()
        out = await loop.run_in_executor(None, self._run, items)
        self._observe(len(items), [self._length(i) for i in items], time.perf_counter() - t0)
        return list(out)

    def _wait_s(self) -> float:
        s = self.settings
        cap = s.max_delay_ms / 1000
        if s.target_p95_ms is None:
            return cap
        gap = max(self._rates.gap, 1e-6)
        if cap / gap < 1.0:
            return 0.0  # light traffic: no other item is likely to arrive in time
        budget = s.target_p95_ms / 1000 - self._rates.run_time(s.max_batch)
        fill = max(0, s.max_batch - self._queued) * gap
        return max(0.0, min(cap, budget, fill))

    def _full_bucket(self) -> list[_Entry[T, R]] | None:
        full = [q for q in self._queues if len(q) >= self.settings.max_batch]
        return min(full, key=lambda q: q[0][:2]) if full else None

    def _first_bucket(self) -> list[_Entry[T, R]] | None:
        """The bucket whose head is due first (earliest turn, then earliest arrival)."""
        live = [q for q in self._queues if q]
        return min(live, key=lambda q: q[0][:2]) if live else None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = self._first_bucket()
            if first is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._inflight is not None:
                # an idle-path run holds the engine: gather behind it, as behind a batch
                await asyncio.wait([self._inflight])
                continue
            wait = self._wait_s()
            self._m_wait.set(wait)
            deadline = first[0][2].enqueued + wait
            while self._full_bucket() is None and (left := deadline - time.perf_counter()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except TimeoutError:
                    break
            queue = self._next_bucket(wait)
            batch: list[_Pending[T, R]] = []
            due = 0  # the turn of the first item run: the work the clock is on
            while queue and len(batch) < self.settings.max_batch:
                turn, _, p = heapq.heappop(queue)
                self._queued -= 1
                if not p.future.done():
                    if not batch:
                        due = turn
                    batch.append(p)
            if batch:
                # What arrives from now on is due the turn after the one being run. Not one
                # turn per run: a request owed more runs than it got (its other buckets' runs,
                # other requests' runs) would be ever further behind the clock, and each new
                # item queued behind all it is owed.
                self._turn = max(self._turn, due + 1)
                await self._run_batch(loop, batch)

    def _next_bucket(self, wait: float) -> list[_Entry[T, R]]:
        """The bucket due first once its head has waited out the wait; until then a full bucket
        may go ahead (a full batch gains nothing by waiting). A full bucket never goes ahead of
        an item whose wait is over, which is what kept one full bucket running indefinitely."""
        first = self._first_bucket()
        assert first is not None
        if time.perf_counter() >= first[0][2].enqueued + wait:
            return first
        return self._full_bucket() or first

    async def _run_batch(
        self, loop: asyncio.AbstractEventLoop, batch: list[_Pending[T, R]]
    ) -> None:
        start = time.perf_counter()
        for p in batch:
            self._m_delay.observe(start - p.enqueued)
        self._batching = True
        try:
            results = await loop.run_in_executor(self._pool, self._run, [p.item for p in batch])
            if len(results) != len(batch):
                raise EngineError(f"engine {self.name} returned {len(results)} for {len(batch)}")
        except asyncio.CancelledError:
            for p in batch:  # shutting down mid-batch: nobody may be left waiting
                if not p.future.done():
                    p.future.set_exception(EngineError(f"engine {self.name} is shutting down"))
            raise
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        finally:
            self._batching = False
        elapsed = time.perf_counter() - start
        self._rates.ran(len(batch), elapsed)
        self._observe(len(batch), [p.length for p in batch], elapsed)
        for p, r in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(r)

    def _observe(self, size: int, lengths: list[int], seconds: float) -> None:
        self._m_size.observe(size)
        self._m_run.observe(seconds)
        if lengths:
            slots = max(lengths) * len(lengths)
            self._m_pad.observe(1.0 - sum(lengths) / slots if slots else 0.0)

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.get_loop().is_closed():
            task.cancel()
            if task.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for q in self._queues:
            for _, _, p in q:
                if not p.future.done():
                    p.future.set_exception(EngineError(f"engine {self.name} is shutting down"))
            q.clear()
        self._pool.shutdown(wait=True)
