"""The Redis tier on a real 3+3 Redis Cluster while a hash slot moves between primaries (what
`redis-cli --cluster reshard` or `rebalance` does, key by key): a batch of lookups is answered
in full, each key from the node that holds it, and the move is no outage."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from cache.codec import CacheEntry
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.redis_topologies import RedisClusterServers, cli
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_purge_fanout_unprimed import _until as until


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


def _entry(key: str) -> CacheEntry:
    return CacheEntry(200, [], body=key.encode(), events=None, ttl=60, model="m", kind="chat")


def _in_slot(prefix: str, slot: int, n: int) -> list[str]:
    """n entry keys whose Redis keys hash to `slot`."""
    names = (f"r.m.t.s{i}" for i in itertools.count())
    return list(
        itertools.islice((k for k in names if key_slot(f"{prefix}{k}".encode()) == slot), n)
    )


def _errors(metrics: CacheMetrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for m in metrics.redis_errors.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


async def test_a_batch_of_lookups_is_answered_while_a_slot_is_resharded(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    """Mid-move, a slot's keys are split between the two primaries, and one MGET of several of
    them is refused (TRYAGAIN, which redis-py retries past the op deadline). The batch was one
    MGET per slot sent together, so the whole batch (every other slot's keys too) timed out:
    each of its lookups missed (an upstream call for an answer Redis held) and the timeout
    counted towards the breaker, which a reshard under load opened."""
    settings = redis_settings(cluster.url, mode="cluster", breaker={"failures": 1, "open_s": 60})
    tier = RedisTier(settings, metrics)
    moving = _in_slot(tier.prefix, key_slot(f"{tier.prefix}r.m.t.s0".encode()), 4)
    stored, absent = moving[:3], moving[3]
    others = [f"r.m.t.other{i}" for i in range(10)]
    slot = key_slot(f"{tier.prefix}{stored[0]}".encode())
    try:
        for k in stored + others:
            await tier.put(k, _entry(k))
        source = cluster.primary_of_slot(slot)
        target = next(n for n in cluster.primaries() if n is not source)
        source_id, target_id = (cli(n.port, "cluster", "myid").strip() for n in (source, target))
        cli(target.port, "cluster", "setslot", str(slot), "importing", source_id)
        cli(source.port, "cluster", "setslot", str(slot), "migrating", target_id)
        moved = cli(source.port, "migrate", "127.0.0.1", str(target.port), "", "0", "5000",
                    "keys", tier.prefix + stored[0])  # fmt: skip
        assert moved.strip() == "OK"

        asked = [*stored, absent, *others]
        got = await asyncio.gather(*(tier.get(k) for k in asked))  # one loop iteration: a batch
        assert [g.body.decode() if g else None for g in got] == [*stored, None, *others]
        assert tier.breaker.state == 0 and _errors(metrics) == {}

        # the move completes: the rest of the keys, then the slot's owner (MOVED from the source)
        for k in stored[1:]:
            cli(source.port, "migrate", "127.0.0.1", str(target.port), tier.prefix + k, "0", "5000")
        for n in cluster.primaries():
            cli(n.port, "cluster", "setslot", str(slot), "node", target_id)
        got = await asyncio.gather(*(tier.get(k) for k in asked))
        assert [g.body.decode() if g else None for g in got] == [*stored, None, *others]
        assert tier.breaker.state == 0 and _errors(metrics) == {}
    finally:
        await tier.aclose()


async def test_lookups_alone_find_the_replica_promoted_in_a_failed_primarys_place(
    metrics: CacheMetrics,
) -> None:
    """A batch of lookups is a pipeline, and redis-py's pipeline re-reads the slot map only in
    its own retries (off here): a process whose Redis traffic was lookups (the entries other
    processes store, or the breaker's half-open probes) sent them to the dead primary for
    ever, and none of them was answered again."""
    cluster = RedisClusterServers().start()
    settings = redis_settings(cluster.url, mode="cluster", breaker={"failures": 10_000})
    tier = RedisTier(settings, metrics)
    keys = [f"r.m.t.k{i}" for i in range(30)]
    try:
        for k in keys:
            await tier.put(k, _entry(k))

        def replicated() -> bool:
            return sum(int(cli(n.port, "dbsize").strip()) for n in cluster.replicas()) == 30

        await until("the replicas never had every entry", replicated)
        cluster.primaries()[0].kill()
        await asyncio.to_thread(cluster.wait_failover)
        for _ in range(200):
            got = await asyncio.gather(*(tier.get(k) for k in keys))
            if [g.body.decode() if g else None for g in got] == keys:
                break
            await asyncio.sleep(0.05)
        assert [g.body.decode() if g else None for g in got] == keys
    finally:
        await tier.aclose()
        cluster.stop()


async def test_a_closed_tier_leaves_no_connection_after_a_failed_node(
    metrics: CacheMetrics,
) -> None:
    """A failed command flags redis-py's cluster client to re-read its slot map, and its
    aclose() then closed nothing: the closed tier kept its connections to every live node."""
    cluster = RedisClusterServers().start()
    tier = RedisTier(redis_settings(cluster.url, mode="cluster"), metrics)
    keys = [f"r.m.t.k{i}" for i in range(30)]
    try:
        for k in keys:
            await tier.put(k, _entry(k))
        dead = cluster.primaries()[0]
        live = [n for n in cluster.primaries() + cluster.replicas() if n is not dead]
        dead.kill()
        await asyncio.gather(*(tier.get(k) for k in keys))  # some meet the dead node
        await tier.aclose()

        def ours(port: int) -> int:
            lines = cli(port, "client", "list").splitlines()
            return sum(1 for ln in lines if " flags=N " in ln and "cmd=client|list" not in ln)

        await until(
            "the closed tier's connections stayed open",
            lambda: not any(map(ours, [n.port for n in live])),
        )
    finally:
        cluster.stop()
