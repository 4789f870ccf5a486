"""The Redis tier on a real 3+3 Redis Cluster: a batch of GETs across hash slots, leases, and
purge and stats over every primary; the URL forms of cluster and sentinel modes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.redis_client import parse_hosts
from cache.tiers.redis import RedisTier
from tests.support.redis_topologies import RedisClusterServers, cli
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_purge_fanout_unprimed import _until as until
from tests.unit.cache.test_purge_resume import one_page_a_try


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


def test_urls_list_several_hosts() -> None:
    hosts, opts = parse_hosts("redis://:s3cret@10.0.0.1:7000,10.0.0.2:7001,node-3/2")
    assert hosts == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("node-3", 6379)]
    assert opts == {"password": "s3cret", "db": 2}
    with pytest.raises(ValueError, match="redis://"):
        parse_hosts("http://10.0.0.1:7000")


async def test_cluster_batches_across_slots_and_purges_every_primary(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    settings = redis_settings(cluster.url, mode="cluster")
    tier = RedisTier(settings, metrics)
    entry = CacheEntry(200, [], body=b"{}", events=None, ttl=60, model="m", kind="chat")
    keys = [f"r.m.t.k{i}" for i in range(40)]
    try:
        for k in keys:
            await tier.put(k, entry)
        # one loop iteration's GETs: one MGET per slot, all answered
        got = await asyncio.gather(*(tier.get(k) for k in keys), tier.get("r.m.t.absent"))
        assert [g is not None for g in got] == [True] * 40 + [False]
        holding = [n for n in cluster.primaries() if int(cli(n.port, "dbsize").strip()) > 0]
        # the entries are spread over every primary (at least 3: under load, with the 1 s node
        # timeout, a replica promoted meanwhile and the primary it replaces may both say master)
        assert len(holding) >= 3
        stats = await tier.stats()
        assert stats["entries"] == 40 and int(str(stats["bytes"])) > 0
        token = await tier.acquire_lease(keys[0], 5000)
        assert token is not None and await tier.acquire_lease(keys[0], 5000) is None
        await tier.release_lease(keys[0], token)
        assert not await tier.lease_held(keys[0])
        assert await tier.purge(Selector.of(None, None, None)) == 40
        assert all(int(cli(n.port, "dbsize").strip()) == 0 for n in cluster.primaries())
        assert tier.breaker.state == 0
    finally:
        await tier.aclose()


async def test_on_a_cluster_deletes_redis_could_not_take_land_across_slots(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    """The remembered deletes go out in batches (cache.tiers.undeleted): on a cluster one
    batch spans every primary's slots, and all of it lands."""
    settings = redis_settings(cluster.url, mode="cluster", breaker={"failures": 1, "open_s": 0.3})
    tier = RedisTier(settings, metrics)
    entry = CacheEntry(200, [], body=b"{}", events=None, ttl=60, model="m", kind="chat")
    keys = [f"r.m.t.late{i}" for i in range(40)]
    try:
        for k in keys:
            await tier.put(k, entry)
        tier.breaker.failure()  # marked down: the deletes are remembered, not sent
        for k in keys:
            await tier.delete(k)
        assert sum(int(cli(n.port, "dbsize").strip()) for n in cluster.primaries()) == 40
        for _ in range(400):
            if not tier.undeleted:
                break
            await asyncio.sleep(0.05)
        assert all(int(cli(n.port, "dbsize").strip()) == 0 for n in cluster.primaries())
        assert tier.breaker.state == 0
    finally:
        await tier.aclose()


async def test_on_a_cluster_a_waiting_purge_goes_on_where_its_last_try_stopped(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    """Each primary's SCAN cursor is kept across tries (RedisTier.purge's `where`), so a purge
    whose tries get one page done each lands on every primary (test_purge_resume.py)."""
    settings = redis_settings(cluster.url, mode="cluster", breaker={"failures": 10_000})
    tier = RedisTier(settings, metrics)
    client: Any = tier.client
    try:  # (several SCAN pages on each primary)
        await client.mset_nonatomic({f"{tier.prefix}other.m.t.k{i}": b"x" for i in range(4000)})
        await client.mset_nonatomic({f"{tier.prefix}r.m.t.k{i}": b"x" for i in range(400)})
        tries = one_page_a_try(tier)
        tier.purges.add(Selector(route_h="r"))
        await until("the purge never landed", lambda: not tier.purges)
        assert tries() > 6
        del tier.client.scan  # (one_page_a_try's)
        left = [k async for k in client.scan_iter(match=f"{tier.prefix}*", count=1000)]
        assert len(left) == 4000 and not any(
            k.startswith(f"{tier.prefix}r.".encode()) for k in left
        )
    finally:
        await tier.aclose()
