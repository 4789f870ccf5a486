"""Circuit breaker per pool: bounded in-flight requests, a bounded wait line, bounded connections.

Over a limit the request fails at once with Overloaded (a 503 with Retry-After downstream).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from backends.errors import Overloaded
from backends.settings import BreakerSettings


class Breaker:
    def __init__(
        self,
        name: str,
        settings: BreakerSettings,
        connections: Callable[[], int],
        on_reject: Callable[[str], None] = lambda limit: None,
    ) -> None:
        self._name = name
        self._settings = settings
        self._connections = connections
        self._on_reject = on_reject
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.rejected: dict[str, int] = {
            "max_in_flight": 0,
            "max_pending": 0,
            "max_connections": 0,
            "queue_deadline": 0,  # queued past the request's deadline (a 504, not a 503)
        }

    @property
    def pending(self) -> int:
        return len(self._waiters)

    def _reject(self, limit: str, detail: str) -> Overloaded:
        self.rejected[limit] += 1
        self._on_reject(limit)
        msg = f"backend {self._name} is over {limit} ({detail})"
        return Overloaded(msg, self._settings.retry_after_s)

    async def acquire(self, timeout_s: float | None = None) -> None:
        """Take an in-flight slot, queueing (at most `timeout_s`: TimeoutError) when all are
        taken; Overloaded when the queue is full too."""
        s = self._settings
        if self._connections() >= s.max_connections:
            raise self._reject("max_connections", str(s.max_connections))
        if self.in_flight < s.max_in_flight and not self._waiters:
            self.in_flight += 1
            return
        if len(self._waiters) >= s.max_pending:
            if s.max_pending == 0:
                raise self._reject("max_in_flight", str(s.max_in_flight))
            raise self._reject("max_pending", str(s.max_pending))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut  # release() hands its slot over: in_flight already counts us
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release()  # we were handed a slot but will not use it
            elif fut in self._waiters:  # (a release() may have dropped it, cancelled, already)
                self._waiters.remove(fut)
            if isinstance(exc, TimeoutError):
                self.rejected["queue_deadline"] += 1
                self._on_reject("queue_deadline")
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.in_flight -= 1
