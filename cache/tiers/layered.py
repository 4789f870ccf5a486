"""L1 → L2 read-through: a memory hit answers at once, an L2 hit is promoted to L1 (unless a
purge ran while L2 answered); puts go to both.

Either level may be absent (a route's `tiers` names which it uses); a missing L2 is a NullTier.
"""

from __future__ import annotations

import time

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.base import Tier
from cache.tiers.memory import MemoryTier
from cache.tiers.null import NullTier


class LayeredTier:
    name = "layered"

    def __init__(self, l1: MemoryTier | None, l2: Tier | None, metrics: CacheMetrics) -> None:
        self.l1 = l1
        self.l2: Tier = l2 if l2 is not None else NullTier()
        self.has_l2 = not isinstance(self.l2, NullTier)
        self._metrics = metrics

    def get_l1(self, key: str) -> CacheEntry | None:
        return self.l1.get_now(key) if self.l1 is not None else None

    async def lookup(self, key: str, checked: bool = False) -> tuple[CacheEntry, str] | None:
        """The entry and the tier that had it, or None. checked: an L2 that cannot answer raises
        TierError instead of answering None (absent)."""
        if self.l1 is not None:
            t0 = time.perf_counter()
            entry = self.l1.get_now(key)
            self._metrics.observe_latency("memory", time.perf_counter() - t0)
            if entry is not None:
                return entry, "memory"
        if not self.has_l2:
            return None
        t0 = time.perf_counter()
        generation = self.l1.generation if self.l1 is not None else 0
        entry = await (self.l2.get_checked(key) if checked else self.l2.get(key))
        self._metrics.observe_latency(self.l2.name, time.perf_counter() - t0)
        if entry is None:
            return None
        # a purge that ran while L2 answered may have missed what it read: that entry still
        # answers this call, but is not promoted into memory to outlive the purge
        if self.l1 is not None and not self.l1.dropped_since(generation, key):
            self.l1.put_now(key, entry)
        return entry, self.l2.name

    async def get(self, key: str) -> CacheEntry | None:
        found = await self.lookup(key)
        return found[0] if found else None

    async def put(self, key: str, entry: CacheEntry) -> None:
        if self.l1 is not None:
            stored = self.l1.put_now(key, entry)
            self._metrics.stores.labels("memory", "ok" if stored else "skipped").inc()
        if self.has_l2:
            await self.l2.put(key, entry)

    async def delete(self, key: str) -> None:
        if self.l1 is not None:
            self.l1.delete_now(key)
        await self.l2.delete(key)

    async def purge(self, selector: Selector) -> int:
        n = await self.l1.purge(selector) if self.l1 is not None else 0
        return n + await self.l2.purge(selector)

    async def stats(self) -> dict[str, object]:
        return {"memory": await self.l1.stats() if self.l1 else {}, "l2": await self.l2.stats()}

    async def aclose(self) -> None:
        return None  # the levels belong to the Cache, which closes them once
