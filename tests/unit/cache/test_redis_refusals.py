"""A Redis that answers but refuses some commands (full, a read-only replica, NOREPLICAS, an ACL)
is no outage: the breaker stays closed, reads go on, and one warning says why; and /readyz says
what opened the breaker when something did."""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis

from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.redis_acl import acl_user
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_tiers import _entry


async def test_readiness_says_why_the_breaker_opened(metrics: CacheMetrics) -> None:
    """A wrong password (or an ACL that denies a command the tier sends) opens the breaker; /readyz
    said only "recent operations failed", its cause in one log line. It names the last failure."""
    server = RedisServer(["--requirepass", "right"]).start()
    url = f"redis://:wrong@127.0.0.1:{server.port}/0"
    tier = RedisTier(redis_settings(url, breaker={"failures": 2, "open_s": 600}), metrics)
    try:
        for i in range(2):
            assert await tier.get(f"k{i}") is None  # a miss, not an error
        health = await tier.health()
        assert health["breaker"] == "open" and health["reachable"] is False
        assert "AuthenticationError" in str(health["error"]), health
    finally:
        await tier.aclose()
        server.stop()


async def test_a_redis_that_refuses_writes_for_want_of_replicas_is_still_read(
    redis_server: RedisServer, metrics: CacheMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    """min-replicas-to-write unmet (NOREPLICAS), like a failing snapshot (MISCONF), refuses
    writes and serves reads. Each miss's read reset the breaker between its refused lease and
    store: nothing was logged, no answer was stored again, and a breaker that opens after two
    failures stopped the reads as well. Now it is a full Redis's case: logged once, still read."""
    tier = RedisTier(
        redis_settings(redis_server.url, breaker={"failures": 2, "open_s": 600}), metrics
    )
    admin = Redis.from_url(redis_server.url)
    caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
    try:
        await tier.put("k.kept", _entry())
        await admin.config_set("min-replicas-to-write", 1)
        for i in range(3):  # a miss each: the lease and the store are refused
            assert await tier.get(f"k{i}") is None
            assert await tier.acquire_lease(f"k{i}", 1000)  # unknown: this process computes
            await tier.put(f"k{i}", _entry())
        assert await tier.get("k.kept") is not None  # still read
        assert tier.breaker.state == 0
        refused = [r.getMessage() for r in caplog.records if "refuses writes" in r.getMessage()]
        assert len(refused) == 1 and "NOREPLICAS" in refused[0], refused
        assert metrics.redis_errors.labels("set", "NOREPLICAS")._value.get() == 3
    finally:
        await admin.config_set("min-replicas-to-write", 0)
        await tier.aclose()
        await admin.aclose()


async def test_an_acl_that_denies_a_command_is_logged_not_silent(
    redis_server: RedisServer, metrics: CacheMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    """A user whose ACL denies SET: each miss's read reset the breaker between its denied lease
    and store, so nothing was ever logged and /readyz said all was well while no answer reached
    Redis. One warning names the command and the key pattern to grant; reads go on."""
    caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
    async with acl_user(redis_server, "set") as user:
        settings = redis_settings(user.url, breaker={"failures": 2, "open_s": 600})
        tier = RedisTier(settings, metrics)
        try:
            for i in range(3):
                assert await tier.get(f"k{i}") is None
                assert await tier.acquire_lease(f"k{i}", 1000)  # unknown: this process computes
                await tier.put(f"k{i}", _entry())
            assert tier.breaker.state == 0
            denied = [r.getMessage() for r in caplog.records if "ACL" in r.getMessage()]
            assert len(denied) == 1 and "'set'" in denied[0], denied
            assert settings.key_prefix in denied[0]
            assert metrics.redis_errors.labels("set", "NoPermissionError")._value.get() == 3
        finally:
            await tier.aclose()
