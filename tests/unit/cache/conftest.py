"""Fixtures for the cache's unit tests: one tier fixture per implementation (real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from cache.metrics import CacheMetrics
from cache.settings import RedisSettings
from cache.tiers.base import Tier
from cache.tiers.layered import LayeredTier
from cache.tiers.memory import MemoryTier
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer


@pytest.fixture
def metrics() -> CacheMetrics:
    return CacheMetrics(CollectorRegistry())


def redis_settings(url: str, **kw: object) -> RedisSettings:
    return RedisSettings.model_validate(
        {"url": url, "key_prefix": f"t{uuid.uuid4().hex[:8]}:", **kw}
    )


@pytest.fixture(params=["memory", "redis", "layered"])
async def tier(
    request: pytest.FixtureRequest, redis_server: RedisServer, metrics: CacheMetrics
) -> AsyncIterator[Tier]:
    t: Tier
    if request.param == "memory":
        t = MemoryTier(1 << 20, metrics)
    elif request.param == "redis":
        t = RedisTier(redis_settings(redis_server.url), metrics)
    else:
        t = LayeredTier(
            MemoryTier(1 << 20, metrics),
            RedisTier(redis_settings(redis_server.url), metrics),
            metrics,
        )
    yield t
    await t.aclose()
    if isinstance(t, LayeredTier):
        await t.l2.aclose()
