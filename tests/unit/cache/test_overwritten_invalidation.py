"""An invalidation whose delete and announcement waited for Redis (the breaker open), and whose
key then got a new answer stored before the retry ran.

Before: the store's SET overwrote the old entry in Redis and the tier forgot the remembered
delete, announcement and all, so the other processes were never told and kept serving the old
answer from their memory until its TTL. Now the store sends the announcement the retry owed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cache import Cache, CacheEntry, request_directives
from cache.breaker import OPEN
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, cache_pair, route, until

OPEN_S = 0.2


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[Cache, Cache]]:
    async with cache_pair(redis_server.url, breaker={"failures": 1, "open_s": OPEN_S}) as caches:
        yield caches


async def test_a_new_answer_stored_before_the_retry_still_has_the_others_told(
    pair: tuple[Cache, Cache],
) -> None:
    a, b = pair
    ra, rb = route(a), route(b)
    assert a.redis is not None
    key = ra.key("m", FIELDS, ALICE)
    assert await ra.store(key, CacheEntry(200, [], body=b"old", ttl=60.0))
    found = await rb.lookup(key, request_directives(None))
    assert found is not None and found[0].body == b"old"  # B holds it in memory now
    # The retry of remembered deletes has not woken yet when the store below lands (it polls
    # every 0.25 s; a store can take the breaker's first probe before it): held asleep here.
    a.redis._retry_s = 3600.0
    a.redis.breaker.failure()  # A is busy elsewhere: its reads timed out, Redis itself is fine
    assert a.redis.breaker.state == OPEN
    await ra.invalidate(key)  # delete and announcement both wait for Redis
    assert a.redis.pending(key.value)
    assert b.memory.get_now(key.value) is not None  # B was not told (yet)
    await asyncio.sleep(OPEN_S)  # the breaker lets its probe through from here on
    # A GET after the DELETE: A's upstream answers it and A stores the new answer
    fresh = ra.key("m", FIELDS, ALICE)
    assert await ra.lookup(fresh, request_directives(None)) is None
    assert await ra.store(fresh, CacheEntry(200, [], body=b"new", ttl=60.0))
    assert not a.redis.pending(key.value)  # the old entry in Redis is overwritten
    await until(
        "B still serves the answer from before the DELETE",
        lambda: b.memory.get_now(key.value) is None,
    )
    found = await rb.lookup(key, request_directives(None))
    assert found is not None and found[0].body == b"new"
