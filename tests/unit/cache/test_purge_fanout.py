"""The purge fan-out on a real Redis: one key's invalidation reaches the other process's memory
tier and drops that key alone, never another tenant's entry for the same target."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import pytest

from cache.codec import CacheEntry
from cache.keys import CacheKey, KeyBuilder, Selector
from cache.purge_fanout import PurgeFanout
from cache.redis_client import connect
from cache.tenant import TenantHasher
from cache.tiers.memory import MemoryTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings


def _entry() -> CacheEntry:
    return CacheEntry(200, [], body=b"{}", ttl=60.0)


def _two(redis_server: RedisServer) -> tuple[PurgeFanout, PurgeFanout, MemoryTier]:
    """A process that announces, and another whose memory tier the fan-out applies to."""
    settings = redis_settings(redis_server.url)
    memory = MemoryTier(1 << 20)

    def apply(selector: Selector, _pending: bool) -> Awaitable[int]:
        return memory.purge(selector)

    here = PurgeFanout(connect(settings, socket_timeout=2, max_connections=2), apply)
    there = PurgeFanout(connect(settings, socket_timeout=2, max_connections=2), apply)
    here.stream_key = there.stream_key = f"{{{settings.key_prefix}}}purge"
    return here, there, memory


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[PurgeFanout, MemoryTier]]:
    """A process that announces, and another whose memory tier the fan-out applies to."""
    here, there, memory = _two(redis_server)
    there.start()
    try:
        # (the tail starts after the newest record: wait until it has looked)
        deadline = time.monotonic() + 10
        while there.last_id is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        yield here, memory
    finally:
        await there.aclose()
        await here.aclose()


def _keys() -> tuple[CacheKey, CacheKey, CacheKey]:
    """alice's GET of a target and of another one, bob's GET of the first: one route, model."""
    keys = KeyBuilder("default", (), TenantHasher(b"s" * 32))
    one = {"method": "GET", "path": "/items/1"}
    alice = {"Authorization": "Bearer sk-alice"}
    return (
        keys.build("", one, alice),
        keys.build("", {**one, "path": "/items/2"}, alice),
        keys.build("", one, {"Authorization": "Bearer sk-bob"}),
    )


async def _applied(memory: MemoryTier, key: str) -> None:
    deadline = time.monotonic() + 10
    while memory.get_now(key) is not None:
        assert time.monotonic() < deadline, "the other process never applied the drop"
        await asyncio.sleep(0.01)


async def test_an_invalidation_drops_that_key_alone_in_the_other_process(
    pair: tuple[PurgeFanout, MemoryTier],
) -> None:
    here, memory = pair
    alice, alice_other, bob = _keys()
    for k in (alice, alice_other, bob):
        memory.put_now(k.value, _entry())
    before = memory.generation
    assert await here.announce(Selector.one(alice), deadline_s=5) == "announced"
    await _applied(memory, alice.value)
    assert memory.get_now(bob.value) is not None  # bob's entry for the same target
    assert memory.get_now(alice_other.value) is not None
    # an answer in flight across the drop is not stored for alice's key, only for it
    assert memory.dropped_since(before, alice.value)
    assert not memory.dropped_since(before, bob.value)


async def test_a_reader_that_ignores_the_key_drops_only_that_tenants_entries(
    pair: tuple[PurgeFanout, MemoryTier],
) -> None:
    """A record read as its route, model and tenant hashes alone (a reader from before the key
    was sent, during a rolling upgrade) drops more of alice's entries, never bob's."""
    here, memory = pair
    alice, alice_other, bob = _keys()
    for k in (alice, alice_other, bob):
        memory.put_now(k.value, _entry())
    await here.announce(Selector(alice.route_h, alice.model_h, alice.tenant_h), deadline_s=5)
    await _applied(memory, alice_other.value)
    assert memory.get_now(alice.value) is None
    assert memory.get_now(bob.value) is not None


async def test_an_announcement_to_a_lost_redis_says_so_and_returns() -> None:
    alice, _, _ = _keys()
    dead = PurgeFanout(
        connect(redis_settings("redis://127.0.0.1:9/0"), socket_timeout=1, max_connections=2),
        lambda _s, _p: asyncio.sleep(0),
    )
    try:
        said = await dead.announce(Selector.one(alice), deadline_s=5)
    finally:
        await dead.aclose()
    assert said.startswith("not announced: ")


async def test_a_purge_announced_as_a_process_starts_serving_reaches_it(
    redis_server: RedisServer,
) -> None:
    """A process primes its tail before it serves (Cache.open): a purge announced right after,
    while its tail has not read yet, is applied. Before, the tail's first read looked for the
    stream's end itself, after the announcement, and skipped it: the entry stayed in memory."""
    here, there, memory = _two(redis_server)
    alice, _, bob = _keys()
    try:
        assert await here.announce(Selector.one(bob), deadline_s=5) == "announced"  # warm
        await there.prime(5.0)  # what Cache.open does before the process serves
        memory.put_now(alice.value, _entry())  # read from Redis as it starts serving
        there.start()
        assert await here.announce(Selector.one(alice), deadline_s=5) == "announced"
        await _applied(memory, alice.value)
    finally:
        await there.aclose()
        await here.aclose()
