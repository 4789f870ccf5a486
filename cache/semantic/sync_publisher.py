"""The semantic sync's publisher (cache.semantic.sync): the local index's adds, removals and
wrong-hit bars go to the shared hash and the stream, in order, from one task, so a miss never
waits on Redis (a hung server held every miss for the client's socket timeout).

It writes only when the exact tier's write breaker lets it (`writes`,
cache.tiers.redis_writes: Redis marked down, or stalling writes), and its verdicts count there.
Meanwhile publications wait in the outbox (bounded) and go once writes resume, one of them the
breaker's probe. Before, a Redis that stalled writes got one pipeline after another, each
waiting out the socket timeout and then dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from redis.typing import EncodableT, FieldT

from cache.outage import OutageLog
from cache.redis_client import AnyRedis, Command, round_trip, stop_task
from cache.semantic.records import Entry, entry_id
from cache.semantic.shared_records import pack
from cache.tiers.redis_writes import WriteGate, gated, stalled

log = logging.getLogger("latentgate.semantic.sync")

# Past this many waiting publications the oldest are dropped (counted: outcome "dropped"); the
# local index has them, other processes miss them.
OUTBOX_MAX = 10_000
_BATCH = 256  # publications per pipeline
# How often a publisher held back by the write breaker asks it again (its open_s paces probes)
HELD_S = 0.25
# Stream events kept (XADD MAXLEN ~): the tails' cap (cache.stream_gap)
STREAM_MAXLEN = 200_000

# A batch Redis failed goes back to the front of the outbox, in order, until it has been tried
# this often: a removal or a wrong-hit bar lost to a blip left the rest of the fleet serving an
# entry this process had removed or demoted (and this one took it back at its next rebuild).
# Bounded, so a refusal that lasts (an ACL) cannot hold the outbox for good.
SEND_TRIES = 5
RETRY_S = 0.2  # the pause after a failed batch, doubled per failure in a row, up to 5 s

# what, exact key, record (None: delete it), its expiry (wall clock), stream event, tries
Publication = tuple[str, str, bytes | None, float, dict[FieldT, EncodableT], int]


class Publisher:
    """Queues publications and sends them from its task (`start`, `aclose`)."""

    def __init__(
        self,
        redis: AnyRedis,
        keys: tuple[str, str, str],
        origin: str,
        entries: Mapping[int, Entry],
        metrics: Any,
    ) -> None:
        """keys: the shared hash, the expiry set, the stream; entries: the local index's (a
        confirmed record marks its entry shared); metrics: the sync's events counter."""
        self.redis = redis
        self.entries_key, self.expiry_key, self.stream_key = keys
        self.origin = origin
        self._entries = entries
        self._m = metrics
        self.writes: WriteGate | None = None  # None: writes are not gated
        self._outbox: collections.deque[Publication] = collections.deque(maxlen=OUTBOX_MAX)
        self._queued = asyncio.Event()
        self._idle = asyncio.Event()  # the outbox is empty and nothing is being sent
        self._idle.set()
        self._held = False
        self._failures = 0  # batches failed in a row
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        hint = 'latentgate_semantic_sync_events_total{outcome="error"}'
        self._log = OutageLog(log, "semantic sync: publishing to Redis", hint)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="semantic-sync-publish")

    async def aclose(self, flush_s: float) -> None:
        """What is still queued goes out if Redis answers within flush_s."""
        self._closing = True
        if self._task is not None:
            self._queued.set()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), flush_s)
            await stop_task(self._task)

    async def add(self, entry: Entry) -> None:
        # The event names the record rather than carrying it: a stream of STREAM_MAXLEN events
        # holding ~1.7 KB vectors each kept ~350 MB in Redis; tails read the hash (one HMGET a
        # batch of events).
        raw, key = pack(entry), entry.exact_key
        await self._publish("add", key, raw, entry.expires_at, {"op": "add", "k": key})

    async def bar(self, entry: Entry) -> None:
        """A wrong-hit report: the record in the hash carries the new bar (for rebuilds), the
        stream tells the live processes."""
        event = {"op": "bar", "k": entry.exact_key, "b": repr(entry.bar)}
        await self._publish("wrong-hit bar", entry.exact_key, pack(entry), entry.expires_at, event)

    async def remove(self, exact_key: str) -> None:
        await self._publish("remove", exact_key, None, 0.0, {"op": "del", "k": exact_key})

    async def _publish(
        self,
        what: str,
        key: str,
        record: bytes | None,
        expires_at: float,
        event: Mapping[str, str | bytes],
    ) -> None:
        """Queue the hash record (written, or deleted when `record` is None) and the stream
        event for the publisher task, in order; never waits on Redis."""
        fields: dict[FieldT, EncodableT] = {"o": self.origin}
        fields.update(event)
        if len(self._outbox) == self._outbox.maxlen:
            self._m.labels("publish", "dropped").inc()  # the oldest gives way
        self._outbox.append((what, key, record, expires_at, fields, 0))
        self._idle.clear()
        self._queued.set()

    async def _run(self) -> None:
        while True:
            if not self._outbox:
                self._idle.set()
                if self._closing:
                    return
                self._queued.clear()
                await self._queued.wait()
                continue
            self._idle.clear()
            if self.writes is not None and not self.writes.allow():
                if self._closing:
                    return  # nothing can be sent (the local index has them)
                if not self._held:  # counted once a hold, not once a look
                    self._held = True
                    self._m.labels("publish", "held").inc(len(self._outbox))
                await asyncio.sleep(HELD_S)
                continue
            self._held = False
            batch = [self._outbox.popleft() for _ in range(min(_BATCH, len(self._outbox)))]
            await gated(self.writes, self._send(batch))
            if self._failures and not self._closing:
                await asyncio.sleep(min(RETRY_S * 2 ** (self._failures - 1), 5.0))

    async def published(self) -> None:
        """Until every publication queued so far has been sent (or has failed)."""
        if self._outbox:
            self._idle.clear()
            self._queued.set()
        await self._idle.wait()

    async def _send(self, batch: list[Publication]) -> str | None:
        """One round trip for the batch (records and events in order). A Redis failure is
        logged and counted, never raised: the local index already has the changes. Returns
        what the write breaker is told (cache.tiers.redis_writes.stalled)."""
        try:
            commands: list[Command] = []
            for _what, key, record, expires_at, fields, _tries in batch:
                if record is None:
                    commands.append(("hdel", (self.entries_key, key), {}))
                    commands.append(("zrem", (self.expiry_key, key), {}))
                else:
                    # the expiry first: a prune between the two (commands one by one on a
                    # cluster) must not find the record's old, passed expiry beside a fresh one
                    commands.append(("zadd", (self.expiry_key, {key: expires_at}), {}))
                    commands.append(("hset", (self.entries_key, key, record), {}))
                stream = {"maxlen": STREAM_MAXLEN, "approximate": True}
                commands.append(("xadd", (self.stream_key, fields), stream))
            await round_trip(self.redis, commands)
            self._mark_shared(batch)
            self._m.labels("publish", "ok").inc(len(batch))
            self._log.ok()
        except Exception as exc:  # (a client-library fault mid-failover too: see RedisTier._guard)
            self._failures += 1
            self._m.labels("publish", "error").inc(len(batch))
            what = batch[0][0] + (f" and {len(batch) - 1} more" if len(batch) > 1 else "")
            self._log.failed(f"{what}: {exc}; kept locally, sent again", len(batch))
            self._again(batch)
            return stalled("semantic sync", exc)
        self._failures = 0
        return None

    def _again(self, batch: list[Publication]) -> None:
        """A failed batch back to the front of the outbox, in order (the commands are
        idempotent and a replayed event is too, so a batch Redis half applied is sent whole);
        those tried SEND_TRIES times are dropped, counted."""
        again = [(*p[:5], p[5] + 1) for p in batch if p[5] + 1 < SEND_TRIES]
        lost = len(batch) - len(again)
        if self._outbox.maxlen is not None:  # the newest give way to the older ones
            lost += max(0, len(self._outbox) + len(again) - self._outbox.maxlen)
        if lost:
            self._m.labels("publish", "dropped").inc(lost)
        self._outbox.extendleft(reversed(again))

    def _mark_shared(self, batch: list[Publication]) -> None:
        """The entries whose records this batch wrote are in the shared store now (a gap
        rebuild may drop them once it no longer holds them). Matched by expiry: one added
        again since waits for its own publication."""
        for _what, key, record, expires_at, _fields, _tries in batch:
            entry = self._entries.get(entry_id(key)) if record is not None else None
            if entry is not None and entry.expires_at == expires_at:
                entry.shared = True
