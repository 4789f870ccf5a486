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

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_purge_fanout_unprimed import _until as until

N = 3000  # the entries it does not match: a few SCAN pages (COUNT 1000)


def one_page_a_try(tier: RedisTier) -> Callable[[], int]:
    """Every other SCAN page runs out of the purge's deadline: a try gets one page done.
    (Raised at once rather than waited out: with a short deadline, a loaded machine ran the
    other pages out of it too, and the purge never got anywhere.)"""
    scan = tier.client.scan
    calls = 0

    async def slow(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            raise TimeoutError("the purge's deadline ran out")
        return await scan(*args, **kwargs)

    tier.client.scan = slow  # type: ignore[method-assign]
    return lambda: calls


async def test_a_waiting_purge_goes_on_where_its_last_try_stopped(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    settings = redis_settings(redis_server.url, breaker={"failures": 10_000})
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


async def test_a_waiting_purge_does_not_hold_the_breakers_probe_while_it_scans(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """After an outage the half-open breaker lets one call through, and every other call is
    refused until it ends. The waiting purge's SCAN was that call: for as long as it ran (up
    to timeouts.admin, on every process told of it) this process read nothing from Redis,
    keys the purge does not match included. Now a PING is the probe, and the SCAN runs once
    the breaker has closed."""
    settings = redis_settings(redis_server.url, breaker={"failures": 1, "open_s": 0.05})
    tier = RedisTier(settings, metrics)
    entry = CacheEntry(200, [], body=b"{}", ttl=60)
    scanning, go_on = asyncio.Event(), asyncio.Event()
    scan = tier.client.scan

    async def held(*args: Any, **kwargs: Any) -> Any:
        scanning.set()
        await go_on.wait()
        return await scan(*args, **kwargs)

    try:
        await tier.put("other.m.t.k", entry)
        tier.breaker.failure()  # Redis was marked down
        tier.client.scan = held  # type: ignore[method-assign]
        tier.purges.add(Selector(route_h="r"))
        await asyncio.wait_for(scanning.wait(), 10)
        assert await tier.get_checked("other.m.t.k") is not None  # before: breaker open
        go_on.set()
        await until("the purge never landed", lambda: not tier.purges)
    finally:
        go_on.set()
        await tier.aclose()
