"""Two caches on one real Redis, as two gateway processes are: for the tests of what one
process's invalidation does to the other's memory tier."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry

from cache import Cache
from cache.route_cache import RouteCache
from cache.settings import CacheSettings, ExactPolicy

FIELDS = {"method": "GET", "path": "/items/1"}
ALICE = {"Authorization": "Bearer sk-alice"}


@asynccontextmanager
async def cache_pair(url: str, **redis: Any) -> AsyncIterator[tuple[Cache, Cache]]:
    """`redis`: settings beside the URL and a fresh key prefix (breaker, pool, timeouts)."""
    doc = {"url": url, "key_prefix": f"t{uuid.uuid4().hex[:8]}:", **redis}
    settings = CacheSettings.model_validate({"tenant_secret": "t" * 32, "redis": doc})
    a, b = Cache(settings, CollectorRegistry()), Cache(settings, CollectorRegistry())
    for c in (a, b):
        await c.open()
    await until(
        "a tail never looked",
        lambda: all(c.fanout is not None and c.fanout.last_id is not None for c in (a, b)),
    )
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def route(cache: Cache) -> RouteCache:
    rc = cache.for_route("default", ExactPolicy(enabled=True, tiers=["memory", "redis"]))
    assert rc is not None
    return rc


async def until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)
