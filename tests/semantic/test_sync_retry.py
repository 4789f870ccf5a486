"""A publication Redis failed is sent again (cache.semantic.sync_publisher SEND_TRIES): a
wrong-hit bar or a removal lost to a blip left every other process serving an entry this one
had demoted or removed, and the shared hash brought it back here at the next rebuild. Redis is
real; its refusal is its own (`min-replicas-to-write` with no replica: NOREPLICAS, as during a
failover), then lifted."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

import cache.semantic.sync_publisher as publisher_module
from cache.embedder import Embedder
from cache.semantic.sync import RedisSync
from cache.semantic.verifier import MlpVerifier
from tests.semantic.test_sync import PARA, Q, new_stage, wait_for
from tests.support.servers import RedisServer


async def _refused_then_lifted(admin: Redis, sync: RedisSync) -> None:
    """Writes refused until the publisher has failed once, then taken again."""
    m = sync.publisher._m
    await wait_for(lambda: m.labels("publish", "error")._value.get() >= 1, limit=10.0)
    await admin.config_set("min-replicas-to-write", 0)


async def test_a_bar_and_a_removal_redis_refused_reach_the_fleet_once_it_takes_writes(
    own_redis: tuple[RedisServer, Redis],
    embedder: Embedder,
    verifier: MlpVerifier,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publisher_module, "RETRY_S", 0.05)
    _, admin = own_redis
    prefix = f"r{time.monotonic_ns()}:"
    url = admin.get_connection_kwargs()
    r1 = Redis(host=url["host"], port=url["port"])
    r2 = Redis(host=url["host"], port=url["port"])
    a, b = new_stage(embedder), new_stage(embedder)
    sa, sb = RedisSync(a, r1, prefix, block_ms=100), RedisSync(b, r2, prefix, block_ms=100)
    await sa.start()
    await sb.start()
    try:
        await a.add("ns", Q, "key-1", ttl=60)
        await a.add("ns", "What is the capital of France?", "key-2", ttl=60)
        await wait_for(lambda: len(b.entries) == 2)
        hit = await b.lookup("ns", PARA, verifier)
        assert hit is not None and hit.exact_key == "key-1"

        await admin.config_set("min-replicas-to-write", 1)
        assert await a.report_wrong("key-1", hit.score)  # that hit was wrong: demoted here
        assert await a.remove_key("key-2")  # and this one purged
        await _refused_then_lifted(admin, sa)
        await sa.published()

        # before: both were dropped, and B went on serving the wrong hit and the purged entry
        await wait_for(lambda: len(b.entries) == 1, limit=10.0)
        assert await b.lookup("ns", PARA, verifier) is None
        assert not await admin.hexists(sa.entries_key, "key-2")
        # and a process starting now rebuilds the demotion, not the entry as it was
        c = new_stage(embedder)
        r3 = Redis(host=url["host"], port=url["port"])
        sc = RedisSync(c, r3, prefix)
        await sc.start()
        assert {e.exact_key for e in c.entries.values()} == {"key-1"}
        assert next(iter(c.entries.values())).bar > hit.score
        await sc.aclose()
        await r3.aclose()
    finally:
        await sa.aclose()
        await sb.aclose()
        await r1.aclose()
        await r2.aclose()


async def test_a_refusal_that_lasts_is_dropped_after_its_tries_not_held_for_good(
    own_redis: tuple[RedisServer, Redis], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ACL that never lets the publisher write must not hold the outbox for good: each
    batch is tried SEND_TRIES times, then dropped (counted), and the publisher goes idle."""
    monkeypatch.setattr(publisher_module, "RETRY_S", 0.01)
    _, admin = own_redis
    url = admin.get_connection_kwargs()
    r1 = Redis(host=url["host"], port=url["port"])
    a = new_stage(embedder)
    sa = RedisSync(a, r1, f"d{time.monotonic_ns()}:", block_ms=100)
    await sa.start()
    try:
        await admin.config_set("min-replicas-to-write", 1)
        await a.add("ns", Q, "key-1", ttl=60)
        await sa.published()  # returns: tried, then given up
        m = a.metrics.sync
        assert m.labels("publish", "error")._value.get() == publisher_module.SEND_TRIES
        assert m.labels("publish", "dropped")._value.get() == 1
        await admin.config_set("min-replicas-to-write", 0)
        assert await admin.hlen(sa.entries_key) == 0
    finally:
        await sa.aclose()
        await r1.aclose()
