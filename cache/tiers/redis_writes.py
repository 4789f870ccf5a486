"""The Redis tier's writes have a breaker of their own (`WriteGate`), beside the tier's.

A Redis that stalls writes and still serves reads (`CLIENT PAUSE ... WRITE`, a primary that
blocks writes while it waits on its disk or replicas): each miss's read answered between its
lease, store and release, which all timed out. The reads reset the tier's breaker, so it never
opened, nothing was logged, and every miss paid three op timeouts (~0.3 s) before its client
had its answer, for as long as the stall lasted. Here only writes count: after
`breaker.failures` of them in a row fail, no write is sent for `breaker.open_s` (the reads go
on), then one write is let through as the probe, whose success resumes writing.

A write goes to Redis only when both breakers let it: the tier's (Redis answers at all) first,
then this one. A write's failure counts here only (a miss's three in a row opened the tier's
breaker too, and stopped reads that worked), its success for both (RedisTier._guard); a read's
verdict is the tier's breaker's alone. In a whole outage both open, each on its own failures.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ResponseError

from cache.breaker import CLOSED, OPEN, Breaker
from cache.metrics import CacheMetrics
from cache.outage import OutageLog
from cache.redis_client import REDIS_ERRORS
from cache.settings import RedisSettings

log = logging.getLogger("latentgate.cache.redis")

STATES = ("closed", "open", "half-open")

T = TypeVar("T")


class WriteGate:
    def __init__(self, settings: RedisSettings, metrics: CacheMetrics, tier: Breaker) -> None:
        self._tier = tier  # the tier's own breaker, which every call goes through first
        self._metrics = metrics
        self.breaker = Breaker(
            settings.breaker.failures, settings.breaker.open_s, on_change=self._changed
        )
        self.last_error = ""
        self._outage = OutageLog(
            log,
            f"redis ({settings.mode}) writes, write breaker open (no lease, store or delete"
            " sent for a while; reads go on while they answer),",
            'latentgate_cache_redis_errors_total{op="lease"|"set"|"delete"}',
        )

    @property
    def state(self) -> int:
        return self.breaker.state

    def report(self, out: dict[str, object]) -> None:
        """The write breaker in /readyz and /admin/cache/stats, beside the tier's `breaker`."""
        out["writes"] = STATES[self.breaker.state]
        if self.breaker.state == OPEN:
            out["writes_error"] = f"writes failing, none sent for now (last: {self.last_error})"

    def allow(self) -> bool:
        """May a write go to Redis now? Both breakers must let it; a half-open probe slot the
        tier's breaker gave is handed back when this one refuses (else no call could probe)."""
        if not self._tier.allow():
            return False
        if self.breaker.allow():
            return True
        self._tier.release()
        return False

    def writing(self) -> bool:
        """Both breakers closed: for a read beside the writes (tenant labels' XRANGE), which
        waits while either is open and never takes a probe slot (its success proves no write
        would land)."""
        return self._tier.state == CLOSED and self.breaker.state == CLOSED

    def allow_probe(self) -> bool:
        """For a waiting purge (RedisTier.purge_ready): whether writes are on or a probe is due
        now; the probe slot is not held, the purge's own verdict (its UNLINKs) settles it."""
        if self.breaker.state == CLOSED:
            return True
        if not self.breaker.allow():
            return False
        self.breaker.release()
        return True

    def settle(self, error: str | None) -> None:
        """The verdict of a write another client sent to the same Redis after `allow` let it
        (the semantic sync's publisher, off the request path): None, Redis took it (or
        answered with a refusal, which is no stall); else why it failed or timed out."""
        if error is None:
            self._tier.success()
            self.breaker.success()
            return
        self._tier.release()  # (a half-open probe slot it held goes back: a read probes)
        self.failure(error)

    def abandon(self) -> None:
        """A write `allow` let through ended without a verdict (cancelled): a probe slot it
        held goes back, else no write could ever probe again."""
        self._tier.release()
        self.breaker.release()

    def success(self) -> None:
        self.breaker.success()

    def failure(self, error: str) -> None:
        self.last_error = error
        self._outage.count()
        self.breaker.failure()

    def release(self) -> None:
        self.breaker.release()

    def _changed(self, state: int) -> None:
        self._metrics.write_breaker_state.set(state)
        log.debug("redis write breaker is now %s", STATES[state])
        if state == OPEN:
            if self._tier.state != OPEN:  # a whole outage is the tier's to log, not this one's
                self._outage.failed(self.last_error)
        elif state == CLOSED:
            self._outage.ok()


def stalled(who: str, exc: Exception) -> str | None:
    """What the write breaker hears of another client's failed write: a refusal (a full or
    read-only Redis, an ACL) is an answer, no stall; anything else is one (RedisTier._guard)."""
    if isinstance(exc, ResponseError):
        return None
    return f"{who}: {type(exc).__name__}: {exc}"


async def gated(gate: WriteGate | None, write: Awaitable[str | None]) -> None:
    """Await a write `gate.allow()` let through (`write` answers None, or `stalled`'s verdict)
    and settle it there; cancelled, a probe slot it held goes back."""
    try:
        error = await write
    except BaseException:
        if gate is not None:
            gate.abandon()
        raise
    if gate is not None:
        gate.settle(error)


async def settled(gate: WriteGate | None, who: str, call: Callable[[], Awaitable[T]]) -> T:
    """Run a round trip `gate.allow()` let through and settle it there: a Redis error is what
    `stalled` makes of it, raised on; its answer, a success; cancelled or another fault (one
    reading the answer), no verdict."""
    try:
        out = await call()
    except REDIS_ERRORS as exc:
        if gate is not None:
            gate.settle(stalled(who, exc))
        raise
    except BaseException:
        if gate is not None:
            gate.abandon()
        raise
    if gate is not None:
        gate.settle(None)
    return out
