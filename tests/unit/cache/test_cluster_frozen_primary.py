"""The Redis tier on a real 3+3 Redis Cluster whose primary is frozen (SIGSTOP: a hung VM, a
stalled disk), not killed: the cluster promotes its replica, and the tier finds it while the old
primary is still frozen."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from cache.tiers.redis_slot_map import SlotMapCheck
from tests.support.redis_topologies import RedisClusterServers, cli
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings

# The cluster needs some seconds to notice (cluster-node-timeout 1 s) and promote; a process
# that never finds the replica never passes, however long it is given.
GIVE_UP_S = 60.0


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers().start()
    try:
        yield servers
    finally:
        for n in servers.nodes:  # a frozen node is woken, then stopped with the others
            if n.proc is not None and n.proc.poll() is None:
                os.kill(n.proc.pid, signal.SIGCONT)
        servers.stop()


def _entry(key: str) -> CacheEntry:
    return CacheEntry(200, [], body=key.encode(), events=None, ttl=60, model="m", kind="chat")


def _frozen(node: RedisServer) -> bool:
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _slots(node: RedisServer) -> set[int]:
    """The hash slots `node` serves."""
    for line in cli(node.port, "cluster", "nodes").splitlines():
        f = line.split()
        if "myself" in f[2]:
            return {
                s
                for r in f[8:]
                if "[" not in r  # (a slot being moved)
                for s in range(int(r.partition("-")[0]), int(r.rpartition("-")[2]) + 1)
            }
    return set()


def _promoted(frozen_id: str, asked: RedisServer) -> bool:
    """Whether `asked` (a live node) sees the frozen node failed and its slots served by
    another primary (its replica), and the cluster whole again."""
    if "cluster_state:ok" not in cli(asked.port, "cluster", "info"):
        return False
    for line in cli(asked.port, "cluster", "nodes").splitlines():
        f = line.split()
        if f and f[0] == frozen_id:
            return "fail" in f[2].split(",") and len(f) == 8  # no slot ranges left
    return False


async def _until(what: str, ok: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not await ok():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_a_frozen_primarys_promoted_replica_serves_lookups_and_writes(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    """A command to a frozen primary never fails in redis-py: the op deadline (0.1 s) cancels it
    before its socket timeout, and only redis-py's own failure makes it re-read the slot map.
    So once the cluster had promoted the replica, every process kept sending the frozen node's
    slots to it: lookups and stores timed out, the breaker opened, and each half-open probe
    timed out too, until the node woke up."""
    settings = redis_settings(cluster.url, mode="cluster")
    writer, reader = RedisTier(settings, metrics), RedisTier(settings, metrics)
    keys = [f"r.m.t.k{i}" for i in range(30)]
    try:
        for k in keys:
            await writer.put(k, _entry(k))
        assert [g.body.decode() if g else None for g in await _get(reader, keys)] == keys

        def replicated() -> bool:
            return sum(int(cli(n.port, "dbsize").strip()) for n in cluster.replicas()) == 30

        await _until("the replicas never had every entry", _sync(replicated))
        victim = cluster.primary_of(f"{writer.prefix}{keys[0]}")
        victim_id = cli(victim.port, "cluster", "myid").strip()
        mine = [k for k in keys if key_slot(f"{writer.prefix}{k}".encode()) in _slots(victim)]
        other = next(n for n in cluster.live() if n is not victim)
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGSTOP)

        async def promoted() -> bool:
            # both processes go on while the cluster notices: their deadlines cancel what they
            # send to the frozen node, and their breakers open
            await writer.put(mine[0], _entry(mine[0]))
            await _get(reader, mine)
            return await asyncio.to_thread(_promoted, victim_id, other)

        await _until("the replica was never promoted", promoted)

        async def shared_hits() -> bool:
            got = await _get(reader, keys)
            return [g.body.decode() if g else None for g in got] == keys

        await _until("no shared hit from the promoted replica", shared_hits)

        fresh = _in_slot_of(writer.prefix, mine[0], "fresh")

        async def stores() -> bool:
            await writer.put(fresh, _entry(fresh))
            got = await reader.get(fresh)
            return got is not None and got.body == fresh.encode()

        await _until("no store reached the promoted replica", stores)

        async def leases() -> bool:
            token = await writer.acquire_lease(fresh, 30_000)
            return bool(token) and await reader.lease_held(fresh)

        await _until("no lease taken on the promoted replica", leases)

        async def purged() -> bool:
            try:
                await writer.purge(Selector(route_h="r"))
            except Exception:
                return False
            return all(g is None for g in await _get(reader, [*keys, fresh]))

        await _until("the purge never reached the promoted replica", purged)
        assert _frozen(victim)  # all of it while the old primary was still frozen
    finally:
        await writer.aclose()
        await reader.aclose()


async def _get(tier: RedisTier, keys: list[str]) -> list[CacheEntry | None]:
    return list(await asyncio.gather(*(tier.get(k) for k in keys)))  # one batch


def _sync(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def ok() -> bool:
        return await asyncio.to_thread(check)

    return ok


def _in_slot_of(prefix: str, key: str, stem: str) -> str:
    """A new entry key in `key`'s hash slot."""
    slot = key_slot(f"{prefix}{key}".encode())
    i = 0
    while key_slot(f"{prefix}r.m.t.{stem}{i}".encode()) != slot:
        i += 1
    return f"r.m.t.{stem}{i}"


def _stat(nodes: list[RedisServer], section: str, field: str) -> int:
    total = 0
    for n in nodes:
        for line in cli(n.port, "info", section).splitlines():
            name, _, value = line.strip().partition(":")
            if name == field:
                total += int(value.split("calls=")[1].split(",")[0] if "calls=" in value else value)
    return total


async def test_a_slow_cluster_is_asked_for_its_slot_map_at_most_once_a_second(
    cluster: RedisClusterServers, metrics: CacheMetrics
) -> None:
    """Ops that run out of their deadline on a slow but unchanged cluster cost it one CLUSTER
    SLOTS a second per process, and no reconnects (re-reading the map has redis-py reconnect
    every connection, which a slow cluster would have paid for once a second)."""
    tier = RedisTier(redis_settings(cluster.url, mode="cluster"), metrics)
    now = [0.0]
    try:
        keys = [f"r.m.t.k{i}" for i in range(30)]
        for k in keys:
            await tier.put(k, _entry(k))
        assert all(await _get(tier, keys))
        client: Any = tier.client
        check = SlotMapCheck(client, deadline_s=5.0, every_s=1.0, clock=lambda: now[0])
        primaries = cluster.primaries()
        slots_asked = _stat(cluster.nodes, "commandstats", "cmdstat_cluster|slots")
        connections = _stat(primaries, "stats", "total_connections_received")

        started = [check.soon() for _ in range(20)]  # a burst of timeouts
        assert started[0] is not None and started[1:] == [None] * 19
        await started[0]
        now[0] += 0.9
        assert check.soon() is None
        now[0] += 0.1
        again = check.soon()
        assert again is not None
        await again

        assert all(await _get(tier, keys))
        # (+1 a node: redis-cli's own, for the first count)
        assert _stat(primaries, "stats", "total_connections_received") == connections + len(
            primaries
        )
        assert _stat(cluster.nodes, "commandstats", "cmdstat_cluster|slots") == slots_asked + 2
        await check.aclose()
        now[0] += 5.0
        assert check.soon() is None  # a closed tier's client is asked nothing more
    finally:
        await tier.aclose()
