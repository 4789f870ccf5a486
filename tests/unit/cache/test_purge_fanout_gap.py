"""A process cut off from the purge stream for longer than the stream holds (10,000
announcements, 1,000 here; every invalidating request adds one) and then back.

Before: its tail resumed from the last purge it had read, XREAD returned what the length cap had
left, and the invalidation of an entry it held in memory was gone without a sign: it served the
deleted answer until its TTL. Now the tail sees that the stream was trimmed past its position
(cache.stream_gap) and drops its memory tier, counted in latentgate_cache_stream_gaps_total.
A tail that is only briefly behind, or a Redis that restarted with no stream, is told apart.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

import cache.purge_fanout as purge_fanout
from cache import Cache, CacheEntry, request_directives
from cache.keys import Selector
from cache.settings import CacheSettings
from tests.support.redis_acl import acl_user
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, route
from tests.unit.cache.test_purge_fanout_unprimed import _until as until


def _settings(url: str, prefix: str) -> CacheSettings:
    redis = {"url": url, "key_prefix": prefix}
    return CacheSettings.model_validate({"tenant_secret": "t" * 32, "redis": redis})


@pytest.fixture(autouse=True)
def _short_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cap trims the same way at 1,000 (XADD MAXLEN ~) with a tenth of the announcements
    monkeypatch.setattr(purge_fanout, "_STREAM_MAXLEN", 1000)


@pytest.fixture
async def user(redis_server: RedisServer) -> AsyncIterator[tuple[str, str, Redis]]:
    """A Redis user (its URL and name) that the admin client can cut off from XREAD."""
    async with acl_user(redis_server) as u:
        yield u.url, u.name, u.admin


def _gaps(cache: Cache) -> float:
    return cache.metrics.stream_gaps.labels("purge")._value.get()


@asynccontextmanager
async def _pair(redis_server: RedisServer, url: str) -> AsyncIterator[tuple[Cache, Cache]]:
    """a: on the user's URL; b: the admin's; both closed after."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a = Cache(_settings(url, prefix), CollectorRegistry())
    b = Cache(_settings(redis_server.url, prefix), CollectorRegistry())
    try:
        for c in (a, b):
            await c.open()
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def _cut_off(a: Cache, name: str, admin: Redis) -> None:
    """A's tail has read (and checked) once; then its XREADs are refused until it has failed."""
    assert a.fanout is not None
    await until("A's tail never read", lambda: a.fanout is not None and not a.fanout._check_gap)
    await admin.execute_command("ACL", "SETUSER", name, "-xread")
    await until("A's tail never failed", lambda: a.fanout is not None and a.fanout._check_gap)


async def _announce(cache: Cache, n: int) -> None:
    assert cache.fanout is not None
    for i in range(n):  # one invalidation each, of keys nobody holds
        await cache.fanout.announce(Selector(key=f"other-{i}"))


async def test_a_tail_cut_off_past_the_streams_length_drops_its_memory_tier(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    url, name, admin = user
    async with _pair(redis_server, url) as (a, b):
        ra, rb = route(a), route(b)
        key = rb.key("m", FIELDS, ALICE)
        assert await rb.store(key, CacheEntry(200, [], body=b"old", ttl=60.0))
        found = await ra.lookup(key, request_directives(None))
        assert found is not None and found[0].body == b"old"  # A holds it in memory now
        await _cut_off(a, name, admin)
        await rb.invalidate(key)  # B deletes it (an unsafe request) and announces that
        await _announce(b, 1300)  # ... and a busy fleet goes on: the cap trims that away
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await until("A never noticed", lambda: _gaps(a) == 1)
        assert a.memory.get_now(key.value) is None  # before: the deleted answer, until its TTL
        assert await ra.lookup(key, request_directives(None)) is None


async def test_a_tail_behind_within_the_streams_length_keeps_its_memory_tier(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    url, name, admin = user
    async with _pair(redis_server, url) as (a, b):
        ra, rb = route(a), route(b)
        kept = rb.key("m", {**FIELDS, "path": "/items/2"}, ALICE)
        gone = rb.key("m", FIELDS, ALICE)
        for k in (kept, gone):
            assert await rb.store(k, CacheEntry(200, [], body=b"v", ttl=60.0))
            assert await ra.lookup(k, request_directives(None)) is not None
        await _cut_off(a, name, admin)
        await rb.invalidate(gone)
        await _announce(b, 700)  # behind, and read in full batches, but nothing trimmed
        applied = a.fanout.applied if a.fanout is not None else 0
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await until(
            "A never caught up", lambda: a.fanout is not None and a.fanout.applied > applied + 700
        )
        assert _gaps(a) == 0
        assert a.memory.get_now(gone.value) is None  # its own invalidation reached it
        assert a.memory.get_now(kept.value) is not None  # and the rest stayed


async def test_a_stream_gone_with_redis_drops_the_memory_tier_once(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    """Redis restarted empty (or was flushed) while A was cut off: what was announced before is
    unknown. A drops its memory once, then reads the new stream from its start."""
    url, name, admin = user
    async with _pair(redis_server, url) as (a, b):
        ra, rb = route(a), route(b)
        key = rb.key("m", FIELDS, ALICE)
        await _announce(b, 3)  # A has read from the stream
        await until("A never read", lambda: a.fanout is not None and a.fanout.applied == 3)
        assert await ra.store(key, CacheEntry(200, [], body=b"v", ttl=60.0))
        await _cut_off(a, name, admin)
        assert b.fanout is not None
        await admin.delete(b.fanout.stream_key)
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await until("A never noticed", lambda: _gaps(a) == 1)
        assert a.memory.get_now(key.value) is None
        await until(
            "A did not read from the start",
            lambda: a.fanout is not None and a.fanout.last_id == "0-0",
        )
        key = ra.key("m", FIELDS, ALICE)  # (a call begun after the drop)
        assert await ra.store(key, CacheEntry(200, [], body=b"v2", ttl=60.0))
        await _announce(b, 1)  # the new stream: read, and no second drop
        await until(
            "A never read the new stream", lambda: a.fanout is not None and a.fanout.applied == 4
        )
        assert _gaps(a) == 1 and a.memory.get_now(key.value) is not None


async def test_a_stream_made_anew_before_the_tail_is_back_drops_the_memory_tier(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    """Redis restarted empty while A was cut off, and the fleet announced again before A's
    next read: the new stream never lost an entry, but the old one's purges A never read are
    gone. Before: A read on from the new stream and served the deleted answer until its TTL."""
    url, name, admin = user
    async with _pair(redis_server, url) as (a, b):
        ra, rb = route(a), route(b)
        key = rb.key("m", FIELDS, ALICE)
        assert await rb.store(key, CacheEntry(200, [], body=b"old", ttl=60.0))
        assert await ra.lookup(key, request_directives(None)) is not None  # in A's memory
        await _announce(b, 2)  # A has read from the stream (its position is an entry of it)
        await until("A never read", lambda: a.fanout is not None and a.fanout.applied == 2)
        await _cut_off(a, name, admin)
        await rb.invalidate(key)  # announced on the old stream only
        assert b.fanout is not None
        await admin.delete(b.fanout.stream_key)  # Redis restarted empty
        await _announce(b, 1)  # the fleet goes on: a new stream
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await until(
            "A never read the new stream", lambda: a.fanout is not None and a.fanout.applied == 3
        )
        assert _gaps(a) == 1
        assert a.memory.get_now(key.value) is None  # before: the deleted answer, until its TTL


async def test_a_stream_behind_the_tail_is_read_on_from_its_newest_entry(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    """After a failover to a replica that was behind (here: the stream made anew with ids below
    what A read), A drops its memory and reads on from the stream's newest entry; before, it
    read from its old position and skipped every purge announced after (their ids are older)."""
    url, name, admin = user
    async with _pair(redis_server, url) as (a, b):
        ra = route(a)
        assert a.fanout is not None and b.fanout is not None
        await _announce(b, 2)
        await until("A never read", lambda: a.fanout is not None and a.fanout.applied == 2)
        await _cut_off(a, name, admin)
        key = b.fanout.stream_key
        await admin.delete(key)
        await admin.xadd(key, {"o": "elsewhere", "r": "", "m": "", "t": "", "k": "x"}, id="1-1")
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await until("A never noticed", lambda: _gaps(a) == 1)
        await until(
            "A did not move back", lambda: a.fanout is not None and a.fanout.last_id == "1-1"
        )
        k = ra.key("m", FIELDS, ALICE)
        assert await ra.store(k, CacheEntry(200, [], body=b"v", ttl=60.0))
        await rb_invalidate(b, k.value)
        await until("A skipped the purge", lambda: a.memory.get_now(k.value) is None)


async def rb_invalidate(b: Cache, key: str) -> None:
    assert b.fanout is not None
    await b.fanout.announce(Selector(key=key))
