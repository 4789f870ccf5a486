"""A small circuit breaker for the Redis tier: skip Redis after repeated failures, probe it back.

closed → (N consecutive failures) → open for open_s → half-open: one probe at a time;
the probe's success closes it, its failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = 0, 1, 2


class Breaker:
    def __init__(
        self,
        failures: int,
        open_s: float,
        on_change: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.open_s = open_s
        self.state = CLOSED
        self._count = 0
        self._opened_at = 0.0
        self._probing = False
        self._on_change = on_change
        self._clock = clock

    def _set(self, state: int) -> None:
        if state != self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(state)

    def allow(self) -> bool:
        """May a call go to Redis now? In half-open only one probe is let through."""
        if self.state == CLOSED:
            return True
        if self.state == OPEN:
            if self._clock() - self._opened_at < self.open_s:
                return False
            self._set(HALF_OPEN)
        if self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        self._count = 0
        self._probing = False
        self._set(CLOSED)

    def failure(self) -> None:
        self._probing = False
        self._count += 1
        if self.state == HALF_OPEN or self._count >= self.failures:
            self._opened_at = self._clock()
            self._set(OPEN)

    def release(self) -> None:
        """A call that was allowed ended without a verdict (e.g. cancelled)."""
        self._probing = False
