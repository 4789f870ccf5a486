"""Retry policy helpers: the shared retry/hedge budget, jittered backoff, what is safe to retry.

Nothing here sends; the pool asks `RetryBudget.try_acquire()` before every retry or hedge.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import TypeVar

from backends.errors import BackendError, UpstreamConnectError, UpstreamProtocolError
from backends.settings import RetryBudgetSettings

T = TypeVar("T")

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


class RetryBudget:
    """Retries and hedges share this budget so they cannot multiply an outage.

    Two limits, both must allow: (1) concurrency, Envoy's: extra attempts in flight stay under
    percent x active requests, never below min_concurrency; (2) volume, Finagle's: a token
    bucket earning percent/100 per request and min_per_s per second (capped at reserve), so over
    any run extra attempts <= reserve + percent% of requests + min_per_s x seconds.
    """

    def __init__(
        self, settings: RetryBudgetSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ratio = settings.percent / 100.0
        self._min_concurrency = settings.min_concurrency
        self._min_per_s = settings.min_per_s
        self._cap = max(settings.reserve, 1.0)
        self._clock = clock
        self._tokens = settings.reserve
        self._last = clock()
        self.active = 0  # downstream requests in the pool
        self.extra_in_flight = 0  # retries and hedges in flight

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._cap, self._tokens + (now - self._last) * self._min_per_s)
        self._last = now

    def request_started(self) -> None:
        self.active += 1
        self._refill()
        self._tokens = min(self._cap, self._tokens + self._ratio)

    def request_finished(self) -> None:
        self.active -= 1

    def try_acquire(self) -> bool:
        limit = max(self._min_concurrency, int(self.active * self._ratio))
        if self.extra_in_flight >= limit:
            return False
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self.extra_in_flight += 1
        return True

    def release(self) -> None:
        self.extra_in_flight -= 1


def backoff_s(attempt: int, base_ms: float, max_ms: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max, base x 2^(attempt-1))]; attempt counts from 1."""
    ceiling = min(max_ms, base_ms * (2 ** max(0, attempt - 1)))
    return rng.uniform(0, ceiling) / 1000.0


def retryable_error(exc: BackendError) -> bool:
    """Before a response reached us: refused/reset connections and replicas that hung up."""
    return isinstance(exc, UpstreamConnectError | UpstreamProtocolError)


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds a replica's Retry-After asks for (RFC 9110 10.2.3: delta-seconds or an HTTP-date,
    `now` in Unix seconds); None when absent or not one of those forms."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; a zone-less one is read so
        return None
    return max(0.0, when.timestamp() - now)


# gRFC A6: a gRPC replica's trailer asking for a wait before the call is retried
PUSHBACK_HEADER = "grpc-retry-pushback-ms"


class Waits:
    """What each replica's Retry-After asked of one request's retries (RFC 9110 10.2.3: it
    speaks for the replica that sent it): when, on the monotonic clock, each wait ends."""

    def __init__(self) -> None:
        self._until: dict[int, float] = {}

    def note(self, replica: object, retry_after: str | None) -> None:
        wait = retry_after_s(retry_after, time.time())
        if wait is not None:
            self._until[id(replica)] = time.monotonic() + wait

    def note_pushback(self, replica: object, pushback_ms: str | None) -> bool:
        """A gRPC replica's grpc-retry-pushback-ms (gRFC A6): a wait like Retry-After's; a
        negative or unreadable one asks that the call not be retried (False)."""
        if pushback_ms is None:
            return True
        value = pushback_ms.strip()
        if not (value.isascii() and value.isdigit()):
            return False
        self._until[id(replica)] = time.monotonic() + int(value) / 1000.0
        return True

    def left(self, replica: object, now: float) -> float:
        return max(0.0, self._until.get(id(replica), 0.0) - now)

    def ready(self, candidates: list[T], now: float) -> list[T]:
        """The candidates not inside a wait they asked for (all of them when none is)."""
        return [r for r in candidates if self.left(r, now) == 0.0] or candidates
