"""A purge on one sidecar reaches the memory tier of every sidecar sharing its Redis.

The purging process deletes the Redis keys itself; what the others still hold is their own
memory tier, which keeps serving an entry until its TTL unless they are told. Each purge's
selector (route, model and tenant hashes, never a credential; for an unsafe request's
invalidation, also the one key) is appended to a Redis Stream,
`{<prefix>}purge`, that every process tails, as the semantic index sync does. A stream, not
pub/sub: a reader that lost its connection resumes from the last purge it applied, so a purge
made during a blip still arrives, and streams work the same on a standalone Redis, Sentinel
and Cluster (one key, one slot).

An invalidation whose own delete Redis did not confirm in time (a timeout under a burst: the
old entry may still be there) is announced as pending: a reader then also deletes that key
itself and reads none of it from Redis until its delete lands. Before, a reader dropped the
entry from its memory, read the old one straight back from Redis and served it until the
announcing process's retry landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from cache.errors import TierError
from cache.keys import Selector
from cache.outage import OutageLog
from cache.purge_records import parse
from cache.redis_client import REDIS_ERRORS, AnyRedis, connect, follow, stop_task
from cache.settings import RedisSettings
from cache.stream_fields import Unusable
from cache.stream_gap import START, missed

log = logging.getLogger("latentgate.cache.purge")

# Admin purges are rare, but every invalidating request (a POST, PUT or DELETE on a cached
# passthrough route) adds one too: 10,000 (~1 MB) covers a reconnect under a burst of those. A
# tail that falls further behind drops its memory tier (cache.stream_gap).
_STREAM_MAXLEN = 10_000
_READ_COUNT = 100


class PurgeFanout:
    """Announces this process's purges and applies the other processes' to `apply`."""

    def __init__(
        self,
        redis: AnyRedis,
        apply: Callable[[Selector, bool], Awaitable[object]],
        prefix: str = "lg:",
        block_ms: int = 500,
        on_error: Callable[[str], None] = lambda _kind: None,
        tail: AnyRedis | None = None,
        slots: int | None = None,
        on_gap: Callable[[], None] = lambda: None,
        on_skip: Callable[[], None] = lambda: None,
    ) -> None:
        """on_error(kind) counts each failed Redis call (the cache's redis_errors counter);
        on_skip each record the tail could not apply and read on past (cache.purge_records).
        `redis` announces; `tail` reads the stream (None: `redis` does both). `slots`: the
        announcements sent at once (None: no bound); the others wait their turn within their
        deadline, since sentinel and cluster pools refuse, not queue, past max_connections."""
        self.redis = redis
        self.tail_redis = tail if tail is not None else redis
        self._slots = asyncio.Semaphore(slots) if slots else None
        self._sending: set[asyncio.Future[str]] = set()  # announcements on their way
        self._socket_s = 2.0  # how long aclose waits for them (from_settings: the socket's)
        self.on_error = on_error
        self.on_gap = on_gap  # counts each time the tail found it had missed purges
        self.on_skip = on_skip
        self.apply = apply
        self.stream_key = f"{{{prefix}}}purge"
        self.origin = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.block_ms = block_ms
        self.last_id: str | None = None  # None: not read yet (start after the newest purge)
        self.applied = 0
        self._check_gap = True  # after the first read and after a reconnect (cache.stream_gap)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        hint = 'latentgate_cache_redis_errors_total{op="purge_fanout"}'
        self._tail_log = OutageLog(log, "purge fan-out: the stream tail", hint)
        # announcing runs per unsafe request too: an outage is logged once, not per request
        self._announce_log = OutageLog(log, "purge fan-out: announcing", hint)

    @classmethod
    def from_settings(
        cls,
        settings: RedisSettings,
        apply: Callable[[Selector, bool], Awaitable[object]],
        on_error: Callable[[str], None],
        on_gap: Callable[[], None] = lambda: None,
        on_skip: Callable[[], None] = lambda: None,
    ) -> PurgeFanout:
        t = settings.timeouts
        # Announcements come with every invalidating request, not only with rare admin purges:
        # their own client, sized like the tier's pool, and no more sent at once than it holds
        # (a burst of DELETEs on a sentinel or cluster was refused "Too many connections", and
        # the other processes kept serving what they deleted). The tail blocks in XREAD for
        # block_ms on a client of its own: its socket timeout is above that, and a burst of
        # announcements cannot take its connection (nor its reconnect close theirs).
        n = settings.pool.max_connections
        sock = 0.5 + 1.0 + t.connect
        pub = connect(settings, socket_timeout=sock, max_connections=n)
        tail = connect(settings, socket_timeout=sock, max_connections=2)
        fanout = cls(
            pub,
            apply,
            settings.key_prefix,
            on_error=on_error,
            tail=tail,
            slots=n,
            on_gap=on_gap,
            on_skip=on_skip,
        )
        fanout._socket_s = sock
        return fanout

    async def prime(self, deadline_s: float) -> None:
        """Learn where the stream ends before the process serves. The tail starts there: left
        to its first read, a purge announced between this process's first reads from Redis and
        that read was skipped, and an entry it had just read stayed in its memory until its TTL.
        A Redis that does not answer in time leaves it to the tail (logged, counted), which
        then drops what the process read meanwhile (`_find_end`)."""
        try:
            async with asyncio.timeout(deadline_s):
                self.last_id = await self._newest()
        except Exception as exc:  # (as the tail: a client-library fault must not fail the start)
            self._failed(exc)

    async def _newest(self) -> str:
        newest: Any = await self.tail_redis.xrevrange(self.stream_key, count=1)
        return newest[0][0].decode() if newest else START

    async def _find_end(self) -> str:
        """The tail's start when `prime` could not learn it. The process may have served (and
        read entries from Redis) since it started, and the purges announced before this read
        are behind the end found here, never read: what the memory tier holds goes (a purge of
        everything, applied as the others' are). Before, an entry read from Redis before such a
        purge stayed in this process's memory until its TTL."""
        end = await self._newest()
        try:  # (before `last_id` is set: a read that waits for it finds the drop done)
            dropped = await self.apply(Selector(), False)
        except Exception:  # as in _apply: the tail goes on
            log.exception("purge fan-out: dropping what was read before the tail started failed")
        else:
            log.warning(
                "purge fan-out: the tail found where the stream ends only after this process"
                " started serving (its prime had no answer): the purges made meanwhile are"
                " unknown, so its memory tier is dropped (%s entries)",
                dropped,
            )
        self.last_id = end
        return end

    def start(self) -> None:
        self._task = asyncio.create_task(self._tail(), name="purge-fanout")

    async def aclose(self) -> None:
        self._closing = True
        if self._sending:  # announcements still on their way: a moment to land, no more
            _, late = await asyncio.wait(set(self._sending), timeout=self._socket_s)
            for send in late:
                send.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await stop_task(self._task)
        await self.redis.aclose()
        if self.tail_redis is not self.redis:
            await self.tail_redis.aclose()

    async def announce(
        self,
        selector: Selector,
        deadline_s: float | None = None,
        on_failure: Callable[[], object] | None = None,
        pending: bool = False,
    ) -> str:
        """Tell the other processes; what the admin answer says about it. `pending`: a one-key
        selector whose delete Redis has not confirmed (the readers delete it too), or a purge
        whose Redis part failed (the readers read none of it from Redis and run it too).
        deadline_s bounds the wait (a request's invalidation must not wait out a stalled
        Redis), not the announcement: one still on its way then is sent on in the background,
        within the client's socket timeout (a burst of DELETEs on a busy process used the
        deadline up while Redis was healthy, and the others kept serving what was deleted)."""
        fields: dict[Any, Any] = {
            b"o": self.origin,
            b"r": selector.route_h or "",
            b"m": selector.model_h or "",
            b"t": selector.tenant_h or "",
        }
        if selector.key is not None:
            # (a reader without this field drops the key's route, model and tenant: more of
            # that one tenant's entries, never another's)
            fields[b"k"] = selector.key
        if pending:
            fields[b"p"] = b"1"
        send = asyncio.ensure_future(self._send(fields, on_failure))
        self._sending.add(send)  # (held until sent: a request's deadline does not cancel it)
        send.add_done_callback(self._sending.discard)
        try:
            async with asyncio.timeout(deadline_s):
                return await asyncio.shield(send)
        except TimeoutError:  # (_send answers its own failures, never raises them)
            return "announcing"

    async def _send(self, fields: dict[Any, Any], on_failure: Callable[[], object] | None) -> str:
        try:
            async with self._slot():
                await self.redis.xadd(
                    self.stream_key, fields, maxlen=_STREAM_MAXLEN, approximate=True
                )
        except Exception as exc:  # Redis errors, and a client-library fault mid-failover too
            self.on_error(type(exc).__name__)
            detail = str(exc) or type(exc).__name__
            self._announce_log.failed(detail)
            if on_failure is not None:  # (the caller's retry: an invalidation's is kept)
                on_failure()
            return f"not announced: {detail}"
        self._announce_log.ok()
        return "announced"

    def _slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._slots if self._slots is not None else contextlib.nullcontext()

    def skipped(self, why: str) -> None:
        """An announcement not made because Redis is known to be down or slow: counted (as
        one that failed) and logged once per outage, as a failed one is."""
        self.on_error("skipped")
        self._announce_log.failed(f"not sent: {why}")

    async def _tail(self) -> None:
        await follow(self.tail_redis, self._read, lambda: self._closing, self._failed)

    async def _read(self) -> None:
        last = self.last_id if self.last_id is not None else await self._find_end()
        resp: Any = await self.tail_redis.xread(
            {self.stream_key: last}, block=self.block_ms, count=_READ_COUNT
        )
        self._tail_log.ok()
        items = [item for _stream, batch in resp or [] for item in batch]
        if self._check_gap or len(items) >= _READ_COUNT:
            if await missed(self.tail_redis, self.stream_key, last):
                await self._missed(last, bool(items))
            self._check_gap = False
        for ident, fields in items:
            await self._apply(ident.decode(), fields)
            self.last_id = ident.decode()  # (after: a purge Redis failed is read again)

    async def _missed(self, last: str, read_on: bool) -> None:
        """Purges this process never read were trimmed from the stream (it was cut off from
        Redis, or behind, for longer than the stream's length covers): which entries they
        deleted is unknown, so what the memory tier holds goes, as when the tail starts late."""
        self.on_gap()
        try:
            dropped = await self.apply(Selector(), False)
        except Exception:  # as in _apply: the tail goes on
            log.exception("purge fan-out: dropping the memory tier after missed purges failed")
            return
        log.warning(
            "purge fan-out: purges announced after %s were trimmed from %s before this process"
            " read them (it was cut off or behind for more than %d announcements): its memory"
            " tier is dropped (%s entries)",
            last,
            self.stream_key,
            _STREAM_MAXLEN,
            dropped,
        )
        if not read_on:
            # the stream is gone or holds nothing past `last`: the tail goes on from its newest
            # entry (its start when it is gone; one before `last` when a failover's replica,
            # or a stream made anew, is behind: XREAD from `last` would skip what comes next)
            self.last_id = await self._newest()

    def _failed(self, exc: Exception) -> None:
        self._check_gap = True
        self.on_error(type(exc).__name__)
        self._tail_log.failed(f"{exc}; retrying with backoff up to 5 s")

    async def _apply(self, ident: str, fields: dict[bytes, bytes]) -> None:
        """One record. One the tail cannot apply (junk, an apply that failed other than on
        Redis) is skipped, counted and logged once; one whose apply Redis failed propagates,
        and the tail reads it again after its backoff: a delete is never lost to an outage."""
        try:
            announced = parse(fields)
        except Unusable as exc:
            self._skip(ident, str(exc))
            return
        if announced.origin == self.origin:
            return
        try:
            await self.apply(announced.selector, announced.pending)
        except (*REDIS_ERRORS, TierError):
            raise
        except Exception:  # one bad record does not stop the tail
            self.on_skip()
            log.exception("purge fan-out: skipped record %s: applying it failed", ident)
            return
        self.applied += 1

    def _skip(self, ident: str, why: str) -> None:
        self.on_skip()
        log.warning("purge fan-out: skipped record %s of %s: %s", ident, self.stream_key, why)
