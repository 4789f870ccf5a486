"""An invalidation whose delete Redis did not take in time (here: the tier's only connection
busy, as under a burst of DELETEs) while the announcement went out on its own client.

Before: the other process dropped the entry from its memory, read the old one straight back from
Redis (the delete had not landed) and served it until the announcing process's retry deleted it.
Found by CI: one burst test in ~5 runs on a loaded 2-core machine left B serving 2-5 of 32
deleted targets. Now the announcement says the delete is pending, and the reader reads none of
that key from Redis until its own delete of it lands.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from cache import Cache, CacheEntry, request_directives
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, cache_pair, route, until


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[Cache, Cache]]:
    async with cache_pair(
        redis_server.url, pool={"max_connections": 1}, timeouts={"op": 0.2}
    ) as caches:
        yield caches


async def test_a_peer_reads_no_old_entry_while_the_delete_is_pending(
    pair: tuple[Cache, Cache], redis_server: RedisServer
) -> None:
    a, b = pair
    ra, rb = route(a), route(b)
    key = ra.key("m", FIELDS, ALICE)
    assert rb.key("m", FIELDS, ALICE).value == key.value  # one deployment secret: one key
    assert await ra.store(key, CacheEntry(200, [], body=b"old", ttl=60.0))
    found = await rb.lookup(key, request_directives(None))
    assert found is not None and found[0].body == b"old"  # B holds it in memory now
    raw = Redis.from_url(redis_server.url)
    assert a.redis is not None and b.redis is not None
    stored = a.redis.prefix + key.value
    pool = a.redis.client.connection_pool
    busy = await pool.get_connection()  # A's only connection: its UNLINK waits, then times out
    try:
        await ra.invalidate(key)
        assert a.redis.pending(key.value)
        assert await raw.exists(stored) == 1  # the old entry is still in Redis
        await until("B's memory still holds it", lambda: b.memory.get_now(key.value) is None)
        assert await rb.lookup(key, request_directives(None)) is None  # not the old answer
        # B deletes it too (its pool is free): the old entry goes without A
        await until("B did not delete it", lambda: not b.redis.undeleted)  # type: ignore[union-attr]
        assert await raw.exists(stored) == 0
        assert a.redis.pending(key.value)  # A's own retry still waits for its connection
    finally:
        await pool.release(busy)
    try:
        await until("A's retry never landed", lambda: not a.redis.undeleted)  # type: ignore[union-attr]
    finally:
        await raw.aclose()
    assert a.fanout is not None and b.fanout is not None
    # A announces its late delete (B has it twice); B, which deleted for A, announces nothing
    await until("A's late delete was not announced", lambda: b.fanout.applied == 2)  # type: ignore[union-attr]
    assert a.fanout.applied == 0
