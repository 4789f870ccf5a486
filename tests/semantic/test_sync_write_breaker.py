"""The semantic index's publisher and pruner write only while the exact tier's write breaker
lets writes go (cache.tiers.redis_writes): with it open (Redis stalled writes), nothing reaches
Redis, the publications wait in the outbox, and they all go once it closes, one of them its
probe. Before, the publisher sent one pipeline after another to a Redis known to stall writes,
each waiting out its socket timeout and then dropped. Observed with Redis's own counts (INFO
commandstats): the breaker is opened by a real stall, which then ends, so whatever is sent
while it stays open lands and is counted."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.breaker import CLOSED, OPEN
from cache.embedder import Embedder
from cache.metrics import CacheMetrics
from cache.semantic.sync import RedisSync
from cache.settings import RedisSettings
from cache.tiers.redis import RedisTier
from tests.semantic.test_sync import new_stage, wait_for
from tests.support.servers import RedisServer
from tests.unit.cache.test_tiers import _entry

WRITES = ("hset", "zadd", "xadd", "eval", "evalsha", "hdel", "zrem")


async def _writes(admin: Redis) -> int:
    stats = await admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in WRITES)


async def test_the_publisher_holds_while_writes_stall_and_sends_everything_after(
    own_redis: tuple[RedisServer, Redis], embedder: Embedder
) -> None:
    server, admin = own_redis
    settings = RedisSettings(
        url=server.url,
        key_prefix=f"w{time.monotonic_ns()}:",
        breaker={"failures": 1, "open_s": 600},
    )
    tier = RedisTier(settings, CacheMetrics(CollectorRegistry()))
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, settings)
    sync.writes = tier.writes
    await sync.start()
    try:
        await admin.client_pause(600_000, all=False)  # WRITE
        await tier.put("k", _entry())  # times out: the write breaker opens
        assert tier.writes.state == OPEN
        await admin.client_unpause()  # (anything sent from here on lands and is counted)
        before = await _writes(admin)

        vec = await stage.embed("How do I reset my password?")
        for i in range(5):
            await stage.add("ns", f"question {i}", f"k{i}", ttl=60, vector=vec)
        m = stage.metrics.sync
        await wait_for(
            lambda: (
                m.labels("publish", "held")._value.get() > 0
                or m.labels("publish", "ok")._value.get() > 0
            ),
            limit=10.0,
        )
        assert await _writes(admin) == before  # before: the five went out at once
        assert m.labels("publish", "held")._value.get() == 5
        assert await admin.hlen(sync.entries_key) == 0

        tier.writes.breaker.open_s = 0  # (its 600 s elapse): the publisher probes, and resumes
        await wait_for(lambda: m.labels("publish", "ok")._value.get() == 5, limit=10.0)
        assert await admin.hlen(sync.entries_key) == 5  # held, none dropped
        assert await _writes(admin) > before
        assert tier.writes.state == CLOSED
    finally:
        await sync.aclose()
        await tier.aclose()
