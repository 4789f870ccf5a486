"""A process whose purge fan-out could not learn where the stream ends before it served (Redis
refused the tail's reads as the process started) and which read entries from Redis meanwhile.

Before: when the tail could read at last it started after the newest purge, skipping the ones
announced while it could not read, so an entry the process had read from Redis before such a
purge stayed in its memory, and was served, until its TTL. Now the tail drops what the memory
tier holds when it has to find the stream's end itself: a purge it could not see may have
named any of it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache import Cache, CacheEntry, request_directives
from cache.route_cache import RouteCache
from cache.settings import CacheSettings, ExactPolicy
from tests.support.servers import RedisServer

FIELDS = {"method": "GET", "path": "/items/1"}
ALICE = {"Authorization": "Bearer sk-alice"}


def _settings(url: str, prefix: str) -> CacheSettings:
    redis = {"url": url, "key_prefix": prefix}
    return CacheSettings.model_validate({"tenant_secret": "t" * 32, "redis": redis})


def _route(cache: Cache) -> RouteCache:
    rc = cache.for_route("default", ExactPolicy(enabled=True, tiers=["memory", "redis"]))
    assert rc is not None
    return rc


async def _until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30  # (the tail's backoff reaches 5 s between tries)
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@pytest.fixture
async def reader(redis_server: RedisServer) -> AsyncIterator[tuple[str, Redis]]:
    """A Redis user that may do everything but read streams (what the tail needs), and an
    admin client that grants it that later."""
    admin = Redis.from_url(redis_server.url)
    user = f"u{uuid.uuid4().hex[:8]}"
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-xread", "-xrevrange"
    )
    try:
        yield f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0", admin
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_a_purge_announced_before_the_tail_could_read_drops_what_was_read_before(
    redis_server: RedisServer, reader: tuple[str, Redis]
) -> None:
    url, admin = reader
    user = url.split("//")[1].split(":")[0]
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    b = Cache(_settings(redis_server.url, prefix), CollectorRegistry())
    a = Cache(_settings(url, prefix), CollectorRegistry())
    try:
        await b.open()
        ra, rb = _route(a), _route(b)
        key = rb.key("m", FIELDS, ALICE)
        assert await rb.store(key, CacheEntry(200, [], body=b"old", ttl=60.0))
        await a.open()  # its prime is refused: the tail is left to find the end itself
        assert a.fanout is not None and a.fanout.last_id is None
        found = await ra.lookup(key, request_directives(None))
        assert found is not None and found[0].body == b"old"  # A serves it, from memory now
        purged = await b.purge(route="default")
        assert purged["redis"] == 1 and purged["other_processes"] == "announced"
        await admin.execute_command("ACL", "SETUSER", user, "+xread", "+xrevrange")
        await _until("A's tail never read", lambda: a.fanout is not None and a.fanout.last_id)
        assert a.memory.get_now(key.value) is None  # before: the purged answer, until its TTL
        assert await ra.lookup(key, request_directives(None)) is None
    finally:
        await a.aclose()
        await b.aclose()
