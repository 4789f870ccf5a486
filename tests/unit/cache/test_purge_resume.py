"""A waiting purge (cache.tiers.redis_purges) on a keyspace too big to scan within one
`timeouts.admin`: each try goes on from where the last one ran out of its deadline.

Before, each try SCANned again from cursor 0, through the same keys it does not match, so it
never got further (a tenant's purge on a Redis holding everyone's entries): it never landed,
and every process told of it kept the keys it matches from Redis for good, running that SCAN
again every few hundred milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import until
from tests.unit.cache.conftest import redis_settings

N = 3000  # the entries it does not match: a few SCAN pages (COUNT 1000)


def one_page_a_try(tier: RedisTier) -> Callable[[], int]:
    """Every other SCAN page outlasts the purge's deadline: a try gets one page done."""
    scan = tier.client.scan
    calls = 0

    async def slow(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            await asyncio.Event().wait()  # (the deadline cancels it)
        return await scan(*args, **kwargs)

    tier.client.scan = slow  # type: ignore[method-assign]
    return lambda: calls


async def test_a_waiting_purge_goes_on_where_its_last_try_stopped(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    settings = redis_settings(
        redis_server.url, timeouts={"admin": 0.5}, breaker={"failures": 10_000}
    )
    tier = RedisTier(settings, metrics)
    admin = Redis.from_url(redis_server.url)
    try:
        await admin.mset({f"{tier.prefix}other.m.t.k{i}": b"x" for i in range(N)})
        await admin.mset({f"{tier.prefix}r.m.t.k{i}": b"x" for i in range(N // 10)})
        tries = one_page_a_try(tier)
        tier.purges.add(Selector(route_h="r"))
        assert tier.purges.blocks("r.m.t.k0") and not tier.purges.blocks("other.m.t.k0")
        await until("the purge never landed", lambda: not tier.purges)
        assert tries() > 2  # (it did run out of its deadline)
        assert not [k async for k in admin.scan_iter(match=f"{tier.prefix}r.*", count=1000)]
        assert len([k async for k in admin.scan_iter(match=f"{tier.prefix}*", count=1000)]) == N
    finally:
        await tier.aclose()
        await admin.aclose()
