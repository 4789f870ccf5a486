"""The Redis tier while Redis stalls writes and answers reads (`CLIENT PAUSE ... WRITE`): the
write breaker (cache/tiers/redis_writes.py) stops leases and stores after a few time out, the
reads go on, a delete is kept and sent once writes go through again, and the stall is logged
once when it starts and once when it ends. The gateway's side:
tests/fault/test_redis_write_stall.py."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis

from cache.breaker import CLOSED, OPEN
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_tiers import _entry


async def _miss(tier: RedisTier, key: str) -> str | None:
    """What a miss sends: a read, then the lease, the store and the lease's release."""
    assert await tier.get(key) is None
    token = await tier.acquire_lease(key, 1000)
    await tier.put(key, _entry())
    if token:
        await tier.release_lease(key, token, retry=False)
    return token


def _timeouts(metrics: CacheMetrics, *ops: str) -> float:
    return sum(metrics.redis_errors.labels(op, "timeout")._value.get() for op in ops)


async def test_a_write_stall_opens_the_write_breaker_and_keeps_deletes(
    own_redis: tuple[RedisServer, Redis],
    metrics: CacheMetrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, admin = own_redis
    # four writes in a row: (with three, a miss's lease, store and release opened the tier's
    # breaker before too, and its reads stopped)
    settings = redis_settings(server.url, breaker={"failures": 4, "open_s": 600})
    tier = RedisTier(settings, metrics)
    caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
    try:
        await tier.put("k.kept", _entry())
        await admin.client_pause(600_000, all=False)  # WRITE
        # two misses: their reads answer, their writes time out (unknown lease: computed here)
        assert await _miss(tier, "k.miss0") and await _miss(tier, "k.miss1")
        sent = _timeouts(metrics, "lease", "set", "delete")

        # writes are skipped now (before: each timed out, and the reads reset the breaker)
        for i in range(3):
            assert await _miss(tier, f"k{i}") == ""  # no lease taken
            assert _timeouts(metrics, "lease", "set", "delete") == sent
        assert await tier.get("k.kept") is not None  # reads go on
        assert tier.writes.state == OPEN and tier.breaker.state == CLOSED
        assert metrics.write_breaker_state._value.get() == OPEN
        # a delete that cannot be written is kept (not read back meanwhile), never dropped
        await tier.delete("k.kept")
        assert tier.pending("k.kept") and await tier.get("k.kept") is None
        assert _timeouts(metrics, "lease", "set", "delete") == sent  # no write went out
        health = await tier.health()
        assert health["reachable"] is True and health["writes"] == "open", health
        assert (await tier.stats())["writes"] == "open"
        opened = [r.getMessage() for r in caplog.records if "write breaker open" in r.getMessage()]
        assert len(opened) == 1, opened

        await admin.client_unpause()
        tier.writes.breaker.open_s = 0  # (its 600 s elapse): the next write is the probe
        for _ in range(400):  # the delete retry (every 0.25 s) probes, and lands
            if not tier.pending("k.kept"):
                break
            await asyncio.sleep(0.05)
        assert not tier.pending("k.kept")
        assert await admin.exists(settings.key_prefix + "e:k.kept") == 0
        assert tier.writes.state == CLOSED
        await tier.put("k.after", _entry())
        assert await admin.exists(settings.key_prefix + "e:k.after") == 1
        ended = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
        assert len(ended) == 1 and "writes" in ended[0], ended
    finally:
        await tier.aclose()


async def test_a_whole_outage_still_opens_the_tiers_breaker(metrics: CacheMetrics) -> None:
    """Writes' failures no longer count for the tier's breaker: a Redis that is gone still
    opens it through the reads, and then no write is sent either."""
    server = RedisServer().start()
    tier = RedisTier(redis_settings(server.url, breaker={"failures": 2, "open_s": 600}), metrics)
    try:
        await tier.put("k", _entry())
        server.stop()
        for i in range(2):
            assert await tier.get(f"k{i}") is None
            await tier.put(f"k{i}", _entry())
        assert tier.breaker.state == OPEN and not tier.writes.allow()
        assert (await tier.health())["reachable"] is False
    finally:
        await tier.aclose()
