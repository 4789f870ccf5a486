"""Single flight: identical concurrent misses in one process share one computation.

The first caller (leader) runs it; the others wait on its future, bounded in time, and get its
result or its exception (no retry storm). A cancelled leader hands over: its waiters start again
and one becomes the new leader. A waiter that times out, or gets an answer it may not share,
computes on its own.

Two ways to use it: `run(key, compute)` when the computation is one awaitable, or `try_lead` /
`future` + `wait_on` when leadership outlives a call, as when a streamed answer is still going
out to the leader's client and the flight must stay open until the stream has been recorded.
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


class CallerGone(Exception):
    """Raised by a computation whose own caller left (its client hung up): a flight it leads
    is abandoned, not failed, so its waiters take over instead of sharing the hang-up."""


class SingleFlight(Generic[T]):
    def __init__(self, metrics: CacheMetrics | None = None) -> None:
        self._flights: dict[str, asyncio.Future[T]] = {}
        self._metrics = metrics

    def in_flight(self) -> int:
        return len(self._flights)

    def try_lead(self, key: str) -> Lead[T] | None:
        """Leadership of `key` when no flight is open for it, else None (then `wait_on`)."""
        if key in self._flights:
            return None
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._flights[key] = fut
        return Lead(self, key, fut)

    def future(self, key: str) -> asyncio.Future[T] | None:
        """The open flight's future (None: no flight), for `wait_on`: held from now, it keeps
        its outcome even when the flight closes before the waiter first runs."""
        return self._flights.get(key)

    async def wait_on(
        self,
        fut: asyncio.Future[T],
        wait_s: float,
        usable: Callable[[T], bool] = lambda r: r is not None,
    ) -> T:
        """The flight's result, from its future (`future`, or the leader's `Lead.future`: it keeps
        its result once the flight has closed, as a semantic join may come as the leader stores
        its answer). Raises its exception, LeaderGone when the leader gave up (try again: one
        caller becomes the new leader) or TimeoutError; counts each outcome (`usable`: whether
        the result answers this waiter, or it computes after all)."""
        try:
            result = await self._wait(fut, wait_s)
        except LeaderGone:
            raise
        except TimeoutError:
            self._count("timeout")
            raise
        except asyncio.CancelledError:
            raise  # the waiter's own business (it stopped waiting), not the flight's outcome
        except BaseException:
            self._count("error")
            raise
        self._count("shared" if usable(result) else "unusable")
        return result

    def _close(self, key: str, fut: asyncio.Future[T]) -> None:
        if self._flights.get(key) is fut:
            del self._flights[key]
        if fut.done() and not fut.cancelled():
            fut.exception()  # marks it retrieved when nobody was waiting

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

    def count(self, outcome: str) -> None:
        """Count a wait's outcome decided outside (`followed`: it took the leader's stream)."""
        self._count(outcome)

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.coalesced.labels(outcome).inc()


class Lead(Generic[T]):
    """One caller's leadership of a flight; exactly one of done / fail / abandon ends it."""

    __slots__ = ("_flight", "_fut", "_key")

    def __init__(self, flight: SingleFlight[T], key: str, fut: asyncio.Future[T]) -> None:
        self._flight = flight
        self._key = key
        self._fut = fut

    @property
    def open(self) -> bool:
        return not self._fut.done()

    @property
    def future(self) -> asyncio.Future[T]:
        """The flight's outcome, for waiters that hold it past the flight (`wait_on`)."""
        return self._fut

    def done(self, result: T) -> None:
        if not self._fut.done():
            self._fut.set_result(result)
        self._flight._close(self._key, self._fut)

    def fail(self, exc: BaseException) -> None:
        if not self._fut.done():
            self._fut.set_exception(exc)
        self._flight._close(self._key, self._fut)

    def abandon(self) -> None:
        """The leader stopped without an answer (cancelled): waiters start again."""
        self.fail(LeaderGone())
