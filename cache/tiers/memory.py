"""L1: an in-process LRU bounded in bytes (not entries), with per-entry expiry.

Entries are kept as objects (no codec on the hot path); `get_now` is the synchronous lookup the
hit path uses, the async methods satisfy the Tier contract.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.metrics import CacheMetrics

_DROP_LOG = 1024  # purges, clears and invalidations remembered (older: any key counts as dropped)


def _every(key: str) -> bool:
    return True


class MemoryTier:
    name = "memory"

    def __init__(self, max_bytes: int, metrics: CacheMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[str, tuple[CacheEntry, int, float]] = OrderedDict()
        self._metrics = metrics
        # Bumped by every purge, clear and invalidation, each logged with what it dropped: a
        # Redis read or an upstream answer that began before one that matches its key must not
        # land here after it (`dropped_since`: LayeredTier.lookup, RouteCache.store/claim).
        self.generation = 0
        self._drops: deque[tuple[int, Callable[[str], bool]]] = deque(maxlen=_DROP_LOG)
        self._evictions = metrics.evictions.labels("memory") if metrics else None
        if metrics is not None:
            metrics.watch("memory", lambda: len(self._data), lambda: self.bytes)

    def __len__(self) -> int:
        return len(self._data)

    def get_now(self, key: str, now: float | None = None) -> CacheEntry | None:
        item = self._data.get(key)
        if item is None:
            return None
        entry, size, expires = item
        if expires <= (time.time() if now is None else now):
            del self._data[key]
            self.bytes -= size
            return None
        self._data.move_to_end(key)
        return entry

    def put_now(self, key: str, entry: CacheEntry) -> bool:
        size = entry.size() + len(key)
        if size > self.max_bytes or entry.expires_at <= time.time():
            return False
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._data[key] = (entry, size, entry.expires_at)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped, _) = self._data.popitem(last=False)
            self.bytes -= dropped
            if self._evictions is not None:
                self._evictions.inc()
        return True

    def delete_now(self, key: str) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    async def get(self, key: str) -> CacheEntry | None:
        return self.get_now(key)

    async def get_checked(self, key: str) -> CacheEntry | None:
        return await self.get(key)  # memory always answers

    async def put(self, key: str, entry: CacheEntry) -> None:
        self.put_now(key, entry)

    async def delete(self, key: str) -> None:
        self.delete_now(key)

    def dropped(self, matches: Callable[[str], bool]) -> None:
        """Log a drop of the keys `matches` says (a purge's selector, one invalidated key)."""
        self.generation += 1
        self._drops.append((self.generation, matches))

    def dropped_since(self, generation: int, key: str) -> bool:
        """Did a purge, clear or invalidation after `generation` drop `key`? Yes when the log
        no longer reaches back that far (the safe answer: that answer is not kept)."""
        if generation >= self.generation:
            return False
        if not self._drops or self._drops[0][0] > generation + 1:
            return True
        return any(g > generation and matches(key) for g, matches in self._drops)

    async def purge(self, selector: Selector) -> int:
        self.dropped(selector.matches)
        if selector.key is not None:  # one invalidated key: no scan of every entry
            gone = [selector.key] if selector.key in self._data else []
        else:
            gone = [k for k in self._data if selector.matches(k)]
        for k in gone:
            self.delete_now(k)
        return len(gone)

    def clear(self) -> int:
        """Drop every entry; how many there were."""
        self.dropped(_every)
        n = len(self._data)
        self._data.clear()
        self.bytes = 0
        return n

    async def stats(self) -> dict[str, object]:
        return {"entries": len(self._data), "bytes": self.bytes, "max_bytes": self.max_bytes}

    async def aclose(self) -> None:
        self._data.clear()
        self.bytes = 0
