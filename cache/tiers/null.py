"""A tier that holds nothing: stands in for L2 when no Redis is configured."""

from __future__ import annotations

from cache.codec import CacheEntry
from cache.keys import Selector


class NullTier:
    name = "null"

    async def get(self, key: str) -> CacheEntry | None:
        return None

    async def get_checked(self, key: str) -> CacheEntry | None:
        return None

    async def put(self, key: str, entry: CacheEntry) -> None:
        return None

    async def delete(self, key: str) -> None:
        return None

    async def purge(self, selector: Selector) -> int:
        return 0

    async def stats(self) -> dict[str, object]:
        return {}

    async def aclose(self) -> None:
        return None
