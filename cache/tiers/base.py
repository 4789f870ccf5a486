"""The Tier contract every store implements: get, put, delete, purge, stats, aclose.

A tier answers None for anything it cannot serve (absent, expired, undecodable, unreachable;
`get_checked` tells unreachable apart by raising);
only the memory tier is allowed to be synchronous underneath.
"""

from __future__ import annotations

from typing import Protocol

from cache.codec import CacheEntry
from cache.keys import Selector


class Tier(Protocol):
    name: str

    async def get(self, key: str) -> CacheEntry | None: ...

    async def get_checked(self, key: str) -> CacheEntry | None:
        """As `get`, but a store that cannot answer raises TierError: None means absent (what a
        caller that would act on an absence, like dropping an index entry, must know)."""
        ...

    async def put(self, key: str, entry: CacheEntry) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def purge(self, selector: Selector) -> int:
        """Remove every entry the selector matches; return how many went."""
        ...

    async def stats(self) -> dict[str, object]: ...

    async def aclose(self) -> None: ...
