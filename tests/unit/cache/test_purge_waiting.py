"""A purge whose Redis part fails (Redis refuses, times out, or the breaker is open).

Before: the purge dropped this process's memory entries, said `redis: {error}` in a 200, and
nothing else happened: once Redis answered, this process (and every other) read the purged
entries back from Redis and served them until their TTL. Now the selector waits: no key it
matches is read from Redis, the purge is run again once Redis takes it, and the announcement
says so, so every other process keeps it from Redis too and runs it itself.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache import Cache, CacheEntry, request_directives
from cache.keys import Selector
from cache.settings import CacheSettings, ExactPolicy
from cache.tenant import tenant_of
from tests.support.redis_acl import acl_user
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, route
from tests.unit.cache.test_purge_fanout_unprimed import _until as until

BOB = {"Authorization": "Bearer sk-bob"}


def _settings(url: str, prefix: str) -> CacheSettings:
    redis = {"url": url, "key_prefix": prefix}
    return CacheSettings.model_validate({"tenant_secret": "t" * 32, "redis": redis})


@pytest.fixture
async def user(redis_server: RedisServer) -> AsyncIterator[tuple[str, str, Redis]]:
    """A Redis user that may not SCAN or UNLINK (a purge fails) until the admin allows it."""
    async with acl_user(redis_server, "scan", "unlink") as u:
        yield u.url, u.name, u.admin


async def test_a_purge_redis_refused_is_not_read_back_and_lands_later(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    url, name, admin = user
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a = Cache(_settings(url, prefix), CollectorRegistry())
    b = Cache(_settings(redis_server.url, prefix), CollectorRegistry())
    for c in (a, b):
        await c.open()
    try:
        ra, rb = route(a), route(b)
        alice, bob = ra.key("m", FIELDS, ALICE), ra.key("m", FIELDS, BOB)
        for k in (alice, bob):
            assert await ra.store(k, CacheEntry(200, [], body=b"answer", ttl=600.0))
        assert await rb.lookup(rb.key("m", FIELDS, ALICE), request_directives(None))  # B too

        out = await a.purge(tenant=tenant_of(ALICE))
        assert out["memory"] == 1 and out["other_processes"] == "announced"
        redis = out["redis"]
        assert isinstance(redis, dict) and redis["retrying"] is True and "error" in redis

        # before: read straight back from Redis and served, here and in B
        assert await ra.lookup(ra.key("m", FIELDS, ALICE), request_directives(None)) is None
        assert a.metrics.purges_waiting._value.get() == 1
        await until("B was not told", lambda: b.memory.get_now(alice.value) is None)
        assert await rb.lookup(rb.key("m", FIELDS, ALICE), request_directives(None)) is None
        # the selector only: Bob's entry is read as before
        assert await ra.lookup(ra.key("m", FIELDS, BOB), request_directives(None)) is not None
        # B, whose Redis takes the purge, ran it
        await until("B did not run the purge", lambda: b.redis is not None and not b.redis.purges)
        assert await admin.exists(f"{prefix}e:{alice.value}") == 0
        assert await admin.exists(f"{prefix}e:{bob.value}") == 1

        await admin.execute_command("ACL", "SETUSER", name, "+scan", "+unlink")
        await until(
            "A's purge never reached Redis", lambda: a.redis is not None and not a.redis.purges
        )
        assert a.metrics.purges_waiting._value.get() == 0
        assert await ra.lookup(ra.key("m", FIELDS, BOB), request_directives(None)) is not None
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_client_library_fault_while_announcing_is_a_failed_announcement(
    redis_server: RedisServer,
) -> None:
    """redis-py can raise other than a RedisError mid-failover (an AttributeError from a
    connection torn down under it: see RedisTier._guard). Announcing let that through, so the
    admin purge answered 500 and the purge was neither announced nor kept to be retried."""
    a = Cache(_settings(redis_server.url, f"t{uuid.uuid4().hex[:8]}:"), CollectorRegistry())
    await a.open()
    try:
        assert a.fanout is not None and a.redis is not None
        client = a.fanout.redis
        a.fanout.redis = object()  # type: ignore[assignment]  # (xadd: AttributeError)
        try:
            out = await a.purge(tenant=tenant_of(ALICE))
        finally:
            a.fanout.redis = client
        assert str(out["other_processes"]).startswith("not announced")
        assert a.redis.purges  # kept: the retry announces it once it lands
    finally:
        await a.aclose()


async def test_a_purge_redis_keeps_refusing_holds_none_of_the_others_back(
    redis_server: RedisServer, user: tuple[str, str, Redis]
) -> None:
    """Two purges wait; then Redis takes one (the ACL lets this user delete route b's keys)
    and keeps refusing the other. Before, the first one was tried again and again at the head
    of the queue: route b's purge never landed (its entry stayed in Redis, and this process read
    none of route b's answers from there)."""
    url, name, admin = user
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a = Cache(_settings(url, prefix), CollectorRegistry())
    owner = Cache(_settings(redis_server.url, prefix), CollectorRegistry())
    await a.open()
    try:
        policy = ExactPolicy(enabled=True, tiers=["memory", "redis"])
        keys = {}
        for r in ("a", "b"):
            rc = owner.for_route(r, policy)
            assert rc is not None
            keys[r] = rc.key("m", FIELDS, ALICE)
            assert await rc.store(keys[r], CacheEntry(200, [], body=b"answer", ttl=600.0))
        for r in ("a", "b"):  # SCAN and UNLINK denied: both wait
            assert isinstance((await a.purge(route=r))["redis"], dict)
        assert a.redis is not None and len(a.redis.purges.waiting) == 2
        b = Selector.of("b", None, None, a.tenants)
        # route a's keys may be read, not deleted; route b's may be (and the purge stream)
        rules = ("+scan", "+unlink", "resetkeys", "%R~*", f"~{prefix}e:{b.pattern()}")
        await admin.execute_command("ACL", "SETUSER", name, *rules, f"~{{{prefix}}}purge")

        await until("route b's purge never ran", lambda: len(a.redis.purges.waiting) == 1)
        assert await admin.exists(f"{prefix}e:{keys['b'].value}") == 0
        assert await admin.exists(f"{prefix}e:{keys['a'].value}") == 1  # still refused
        assert a.redis.purges.waiting[0] == Selector.of("a", None, None, a.tenants)
    finally:
        await a.aclose()
        await owner.aclose()
