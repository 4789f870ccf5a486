"""The Redis tier's deletes that Redis could not take yet: remembered (cache.tiers.undeleted),
journaled for the next process (cache.tiers.delete_journal), retried once Redis answers, and
announced to the other processes then (`on_late_delete`). A mixin of RedisTier: it uses the
tier's client, breaker, deadline guard and metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from cache.breaker import Breaker
from cache.errors import TierError
from cache.metrics import CacheMetrics
from cache.redis_client import AnyRedis
from cache.tiers.redis_writes import WriteGate
from cache.tiers.undeleted import UndeletedKeys

log = logging.getLogger("latentgate.cache.redis")


class WaitingDeletes:
    # the tier's (cache.tiers.redis.RedisTier)
    client: AnyRedis
    prefix: str
    breaker: Breaker
    writes: WriteGate
    undeleted: UndeletedKeys
    on_late_delete: Callable[[list[str]], Awaitable[None]] | None
    _metrics: CacheMetrics
    _retrying: asyncio.Task[None] | None
    _retry_s: float

    def _guard(
        self, op: str, deadline_s: float | None = None, write: bool = False
    ) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    async def delete(self, key: str) -> None:
        """Delete now, or, when Redis cannot take it, remember the key until it can
        (cache.tiers.undeleted). Remembered first: a request cancelled mid-delete, or a read
        of the key meanwhile, then sees it as deleted too."""
        self._remember(key)
        if not self.writes.allow():  # Redis down, or stalling writes: kept, sent once it takes them
            self.undeleted.keep(key)
            self._retry_later()
            return
        try:
            async with self._guard("delete", write=True):
                await self.client.unlink(self.prefix + key)
        except TierError:
            self.undeleted.keep(key)
            self._retry_later()
            return
        self._forget(key)

    def redo(self, key: str, announce: bool = True) -> None:
        """Delete `key` again once Redis answers, and have the others told then (an
        invalidation whose announcement was skipped or failed: the delete may have landed, the
        others' memory tiers were not told). announce=False: another process's invalidation
        whose delete it could not confirm, and which it announced itself: this process reads
        none of it from Redis meanwhile, and deletes it too."""
        self._remember(key, announce)
        self.undeleted.keep(key)
        self._retry_later()

    def pending(self, key: str) -> bool:
        """Whether this process's delete of `key` has not reached Redis yet."""
        return key in self.undeleted

    def _remember(self, key: str, announce: bool = True) -> None:
        if self.undeleted.add(key, announce):
            self._metrics.undeleted_forgotten.inc()
            log.warning(
                "redis: more than %d deletes waiting for Redis; the oldest is forgotten (its"
                " entry lives until its TTL)",
                self.undeleted.cap,
            )
        self._metrics.undeleted.set(len(self.undeleted))

    def _overwritten(self, key: str) -> None:
        """A store replaced the entry a remembered delete was for: no delete is left to send,
        but an announcement the others were owed still is (else they serve their memory copy
        of the old answer until its TTL): sent now, as the retry would have."""
        told = self.undeleted.to_announce([key])
        self._forget(key)
        if told:
            self._spawn(self._announce_late(told))

    async def _announce_late(self, keys: list[str]) -> None:
        if self.on_late_delete is None:
            return
        try:  # (Cache._announce_late puts one that fails back on the list)
            await self.on_late_delete(keys)
        except Exception:  # the cache boundary: the deletes (or overwrites) themselves landed
            log.exception("announcing late deletes failed")

    def resume(self) -> None:
        """Start sending the deletes a stopped process left (taken from its journal when the
        tier was built): from Cache.open, on the running loop, not from the constructor."""
        if self.undeleted:
            self._retry_later()

    def _retry_later(self) -> None:
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.ensure_future(self._retry_deletes())

    def _forget(self, key: str) -> None:
        if key in self.undeleted:
            self.undeleted.discard(key)
            self._metrics.undeleted.set(len(self.undeleted))

    async def _retry_deletes(self) -> None:
        """Delete the remembered keys once Redis takes commands (the breaker lets a call
        through), in batches, then tell the other processes (on_late_delete: their memory tiers
        may hold the same entries, and the request's own announcement was skipped or lost)."""
        while self.undeleted:
            await asyncio.sleep(self._retry_s)
            keys = self.undeleted.oldest(500)
            if not keys or not self.writes.allow():
                continue
            try:
                async with self._guard("delete", write=True):
                    await self.client.unlink(*(self.prefix + k for k in keys))
            except TierError:
                continue
            # read after the UNLINK: a redo() that asked for an announcement meanwhile has it
            told = self.undeleted.to_announce(keys)
            for k in keys:
                self._forget(k)
            self.undeleted.settle()
            if told:
                await self._announce_late(told)
        self.undeleted.settle()  # (emptied by stores too: an overwritten entry needs no delete)
