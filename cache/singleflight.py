"""Single flight: identical concurrent misses in one process share one computation.

The first caller (leader) runs it; the others wait on its future, bounded in time, and get its
result or its exception (no retry storm). A cancelled leader hands over: its waiters start again
and one becomes the new leader. A waiter that times out, or gets an answer it may not share,
computes on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from cache.metrics import CacheMetrics

T = TypeVar("T")

_MAX_HANDOVERS = 3


class LeaderGone(Exception):
    """The leader was cancelled before it finished; waiters should try again."""


class SingleFlight(Generic[T]):
    def __init__(self, metrics: CacheMetrics | None = None) -> None:
        self._flights: dict[str, asyncio.Future[T]] = {}
        self._metrics = metrics

    def in_flight(self) -> int:
        return len(self._flights)

    async def run(
        self,
        key: str,
        compute: Callable[[], Awaitable[T]],
        wait_s: float,
        shareable: Callable[[T], bool] = lambda _: True,
    ) -> tuple[T, bool]:
        """(result, led): led is False when another caller's computation answered."""
        for _ in range(_MAX_HANDOVERS):
            fut = self._flights.get(key)
            if fut is None:
                return await self._lead(key, compute), True
            try:
                result = await self._wait(fut, wait_s)
            except LeaderGone:
                continue
            except TimeoutError:
                self._count("timeout")
                break
            except BaseException:
                self._count("error")
                raise
            if not shareable(result):
                break
            self._count("shared")
            return result, False
        return await compute(), True

    async def _lead(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._flights[key] = fut
        try:
            result = await compute()
        except asyncio.CancelledError:
            fut.set_exception(LeaderGone())
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            if self._flights.get(key) is fut:
                del self._flights[key]
            if fut.done() and not fut.cancelled():
                fut.exception()  # marks it retrieved when nobody was waiting

    async def _wait(self, fut: asyncio.Future[T], wait_s: float) -> T:
        if self._metrics is not None:
            self._metrics.waiters.inc()
        try:
            async with asyncio.timeout(wait_s):
                # shield: a waiter's own cancellation must not cancel the shared future.
                return await asyncio.shield(fut)
        finally:
            if self._metrics is not None:
                self._metrics.waiters.dec()

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.coalesced.labels(outcome).inc()
