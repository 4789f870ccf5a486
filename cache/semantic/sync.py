"""Share the semantic index across gateway processes through Redis.

Entries live in a Redis hash (`{<prefix>sem:<space>}:entries`, exact key → msgpack record; space:
the embedder's, cache.embedder.embedding_space) and every add, removal and wrong-hit bar is also
appended to a Redis Stream (`{<prefix>sem:<space>}:log`); an add's event names its record, which
the tails read from the hash. Expired records leave the hash through a sorted set of expiries
(`{<prefix>sem:<space>}:expiry`, cache.semantic.shared_records). The hash tag puts all
three on one slot of a Redis Cluster, so a publish is one round trip to one primary, and a
failover of that primary loses at most the events its replica had not received yet: the tail
resumes from its last id on the promoted replica. At start-up a process rebuilds its local index
from the hash, then tails the stream from the id it saw before the scan (replays are
idempotent); a tail that finds the stream's cap trimmed events it had not read rebuilds the same
way, and drops the entries the hash no longer holds. Redis failures are counted
(`latentgate_semantic_sync_events_total` with outcome "error") and logged once per state change;
the local index keeps serving, and the tail reconnects with backoff.

The tail has its own client: its XREAD blocks for `block_ms`, longer than the short op timeout the
publishing client has, so on a shared client every idle read timed out and warned.

Publishing is cache/semantic/sync_publisher.py's. It and the pruner write only when the exact
tier's write breaker lets them (`writes`, cache.tiers.redis_writes: Redis marked down, or
stalling writes), and their verdicts count there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any

from cache.outage import OutageLog
from cache.redis_client import (
    REDIS_ERRORS,
    AnyRedis,
    connect,
    follow,
    stop_task,
)
from cache.semantic.records import Entry, entry_id
from cache.semantic.shared_records import SharedRecords, unpack
from cache.semantic.stage import SemanticStage
from cache.semantic.sync_events import Event, read_events
from cache.semantic.sync_publisher import STREAM_MAXLEN, Publisher
from cache.settings import RedisSettings
from cache.stream_gap import START, missed
from cache.tiers.redis_writes import WriteGate, gated, stalled

log = logging.getLogger("latentgate.semantic.sync")

_READ_COUNT = 500
# How often a process deletes expired records from the shared hash
PRUNE_INTERVAL_S = 60.0


class RedisSync:
    """Replicator for SemanticStage; `start()` rebuilds and starts the tail task."""

    def __init__(
        self,
        stage: SemanticStage,
        redis: AnyRedis,
        prefix: str = "lg:",
        block_ms: int = 500,
        tail: AnyRedis | None = None,
    ) -> None:
        """`tail` is the stream reader's client (its socket timeout must exceed block_ms);
        None: `redis` serves both. The keys are the stage's embedding space's: a process whose
        embedder maps texts elsewhere (another model, tokenizer or window: a rollout, a config
        change and a restart) shares nothing with it, rather than comparing its questions with
        vectors of another space (wrong hits) or of another width (a failed start)."""
        self.stage = stage
        self.redis = redis
        self.tail_redis = tail if tail is not None else redis
        space = getattr(stage.embedder, "space", "")
        tag = f"{prefix}sem" + (f":{space}" if space else "")
        self.entries_key = f"{{{tag}}}:entries"
        self.expiry_key = f"{{{tag}}}:expiry"
        self.stream_key = f"{{{tag}}}:log"
        old = f"{{{prefix}sem}}"
        legacy = (f"{old}:entries", f"{old}:expiry", f"{old}:log") if space else None
        self.shared = SharedRecords(
            redis, self.entries_key, self.expiry_key, stage.index.dim, legacy
        )
        self.origin = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.block_ms = block_ms
        self.last_id = START
        self._check_gap = True  # after the first read and after a reconnect (cache.stream_gap)
        self._owned: list[AnyRedis] = []
        self._task: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None
        self._closing = False
        self._m = stage.metrics.sync
        hint = 'latentgate_semantic_sync_events_total{outcome="error"}'
        self._tail_log = OutageLog(log, "semantic sync: the stream tail", hint)
        keys = (self.entries_key, self.expiry_key, self.stream_key)
        self.publisher = Publisher(redis, keys, self.origin, stage.entries, self._m)

    @classmethod
    def from_settings(
        cls, stage: SemanticStage, settings: RedisSettings, block_ms: int = 500
    ) -> RedisSync:
        """A replicator with its own two clients (closed by aclose): publishing is one short
        pipeline; the tail blocks in XREAD for block_ms, so its connection's timeout is above
        that (with the op timeout on it, every idle read failed and warned)."""
        t = settings.timeouts
        # sentinel and cluster pools refuse (not queue) past max_connections: size it like
        # the tier's pool, for bursts of concurrent misses
        pub = connect(
            settings,
            socket_timeout=max(t.op, 0.5),
            max_connections=settings.pool.max_connections,
        )
        tail = connect(
            settings, socket_timeout=block_ms / 1000 + 1.0 + t.connect, max_connections=2
        )
        sync = cls(stage, pub, settings.key_prefix, block_ms=block_ms, tail=tail)
        sync._owned = [pub, tail]
        return sync

    async def start(self) -> None:
        try:
            await self.rebuild()
        except REDIS_ERRORS as exc:
            log.warning("semantic sync: rebuild from Redis failed (%s); starting empty", exc)
            self._m.labels("rebuild", "error").inc()
        self.stage.replicator = self
        self._task = asyncio.create_task(self._tail(), name="semantic-sync-tail")
        self.publisher.start()
        self._pruner = asyncio.create_task(self._prune_loop(), name="semantic-sync-prune")

    async def aclose(self, flush_s: float = 2.0) -> None:
        self._closing = True
        await stop_task(self._task)
        await stop_task(self._pruner)
        self.stage.replicator = None
        await self.publisher.aclose(flush_s)
        for client in self._owned:
            await client.aclose()

    async def rebuild(self) -> int:
        """Load the hash's live records; the tail then reads from the id the stream ended at
        before the scan (replays are idempotent). last_id moves only once the scan is done: a
        rebuild that fails midway (the tail's, after a gap) leaves it where it was, so the
        retry finds the gap again and rebuilds again (before, it read on from the stream's end
        and the records the scan had not reached were missing until the next start).

        The local entries the hash held before the scan (`Entry.shared`) and no longer holds
        were removed by another process (a purge, a stale payload) or expired there: they go
        too, as the `del` events a tail cut off past the cap never read would have done. An
        entry this process added and has not published (or could not: Redis was down) is its
        own and stays, as does one added again while the scan ran."""
        newest: Any = await self.redis.xrevrange(self.stream_key, count=1)
        end = newest[0][0].decode() if newest else START
        held = {i: e for i, e in self.stage.entries.items() if e.shared}
        now, n = time.time(), 0
        bad = 0
        seen: set[int] = set()
        async for key, entry in self.shared.records():
            seen.add(entry_id(key))  # (an unreadable record is still there: its entry stays)
            if entry is None:  # a record this version cannot read: the others still load
                bad += 1
            elif entry.expires_at > now:
                self.stage.apply_add(entry)
                n += 1
        if bad:
            self._m.labels("rebuild", "skipped").inc(bad)
            log.warning("semantic sync: skipped %d unreadable records in %s", bad, self.entries_key)
        # identity: an entry added again meanwhile is another object, not published yet
        gone = [e for i, e in held.items() if i not in seen and self.stage.entries.get(i) is e]
        for e in gone:
            self.stage.apply_remove(e.exact_key)
        if gone:
            self._m.labels("rebuild", "removed").inc(len(gone))
        self.last_id = end
        log.info(
            "semantic sync: rebuilt %d entries from Redis, removed %d it no longer holds",
            n,
            len(gone),
        )
        return n

    async def prune(self, now: float | None = None) -> int:
        """Delete the records whose entries have expired from the shared hash (each process
        drops them from its own index itself; cache.semantic.shared_records)."""
        total = await self.shared.prune(time.time() if now is None else now)
        if total:
            self._m.labels("prune", "ok").inc(total)
        return total

    async def _prune_loop(self) -> None:
        while not self._closing:
            if self.writes is None or self.writes.allow():  # (else: the next round)
                await gated(self.writes, self._prune_once())
            await asyncio.sleep(PRUNE_INTERVAL_S)

    async def _prune_once(self) -> str | None:
        try:
            await self.prune()
        except Exception as exc:  # (the publisher's log says Redis is down)
            # Exception: a client-library fault mid-failover (as _send) must not end the
            # pruning for the process's life, nor come out of aclose through stop_task
            self._m.labels("prune", "error").inc()
            log.debug("semantic sync: pruning expired records failed: %s", exc)
            return stalled("semantic sync", exc)
        return None

    async def publish_add(self, entry: Entry) -> None:
        await self.publisher.add(entry)

    async def publish_bar(self, entry: Entry) -> None:
        await self.publisher.bar(entry)

    async def publish_remove(self, exact_key: str) -> None:
        await self.publisher.remove(exact_key)

    async def published(self) -> None:
        """Until every publication queued so far has been sent (or has failed)."""
        await self.publisher.published()

    @property
    def writes(self) -> WriteGate | None:
        """The exact tier's write breaker (SemanticSetup sets it): None, writes are not gated."""
        return self.publisher.writes

    @writes.setter
    def writes(self, gate: WriteGate | None) -> None:
        self.publisher.writes = gate

    def _apply(self, ident: str, event: Event, records: dict[str, bytes | None]) -> None:
        if event.origin == self.origin:
            return
        if event.op == "add":
            raw = event.record or records.get(event.key or "")
            if raw is None:  # removed (or expired) since: a later event says so, or said so
                return
            try:
                entry = unpack(raw, self.stage.index.dim)
            except Exception as exc:  # as in rebuild: skipped and counted, the tail reads on
                self._skip(ident, f"its record cannot be read ({exc})")
                return
            self.stage.apply_add(entry)
        elif event.key is not None and event.op == "del":
            self.stage.apply_remove(event.key)
        elif event.key is not None:
            self.stage.apply_bar(event.key, event.bar)
        self._m.labels("apply", "ok").inc()

    def _skip(self, ident: str, why: str) -> None:
        """An event the tail cannot apply: counted, logged (once: the tail has moved past it)."""
        self._m.labels("apply", "skipped").inc()
        log.warning("semantic sync: skipped event %s of %s: %s", ident, self.stream_key, why)

    async def _tail(self) -> None:
        await follow(self.tail_redis, self._read, lambda: self._closing, self._tail_failed)

    async def _read(self) -> None:
        last = self.last_id
        resp: Any = await self.tail_redis.xread(
            {self.stream_key: last}, block=self.block_ms, count=_READ_COUNT
        )
        self._tail_log.ok()
        items = [item for _stream, batch in resp or [] for item in batch]
        if self._check_gap or len(items) >= _READ_COUNT:
            gap = await missed(self.tail_redis, self.stream_key, last)
            self._check_gap = False
            if gap:
                # adds, removals and wrong-hit bars this process never read were trimmed: the
                # hash holds every live record with its bar, so a rebuild brings the adds and
                # bars and drops what it no longer holds (and moves last_id to the stream's
                # end, past this batch, which the hash also holds)
                self._m.labels("tail", "gap").inc()
                n = await self.rebuild()
                log.warning(
                    "semantic sync: events after %s were trimmed from %s before this process"
                    " read them (cut off or behind for more than %d events); rebuilt %d"
                    " entries from the shared hash",
                    last,
                    self.stream_key,
                    STREAM_MAXLEN,
                    n,
                )
                return
        # An add event names its record; the records of a batch's adds come in one HMGET, read
        # before last_id moves (a failed read is read again). The hash holds each key's latest
        # record, so an add followed by a remove in the batch finds none, as it should.
        events = read_events(items)
        keys = sorted(
            {
                e.key
                for _, e in events
                if isinstance(e, Event) and e.names_record and e.key is not None
                if e.origin != self.origin
            }
        )
        records: dict[str, bytes | None] = {}
        if keys:
            values: list[Any] = await self.tail_redis.hmget(self.entries_key, keys)
            records = dict(zip(keys, values, strict=True))
        for ident, event in events:
            self.last_id = ident
            if isinstance(event, Event):
                self._apply(ident, event, records)
            else:
                self._skip(ident, event)

    def _tail_failed(self, exc: Exception) -> None:
        self._check_gap = True
        self._m.labels("tail", "error").inc()
        self._tail_log.failed(f"{exc}; retrying with backoff up to 5 s")
