"""The Redis tier in sentinel mode on real sentinels (cache.sentinel_pool): a closed client
leaves no connection to them, and when servers freeze (SIGSTOP: a hung VM) rather than die (the
primary and the sentinel the client asks first), the other two sentinels promote the replica and
the tier finds it while both are still frozen."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.redis_topologies import MASTER, RedisSentinelServers, cli, started_sentinels
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_cluster_frozen_primary import _entry, _frozen, _get, _sync, _until


@pytest.fixture
def sentinel() -> Iterator[RedisSentinelServers]:
    with started_sentinels() as topo:
        yield topo


def _askers(port: int) -> int:
    """Connections to a sentinel whose last command asked it for the primaries: redis-py's
    (the sentinels' links to each other come and go, and send others)."""
    return sum("cmd=sentinel|masters" in line for line in cli(port, "client", "list").splitlines())


async def test_a_closed_client_leaves_no_connection_to_the_sentinels(
    sentinel: RedisSentinelServers, metrics: CacheMetrics
) -> None:
    """Each sentinel-mode client (the tier's, the semantic publisher's and tail's, the purge
    fan-out's) asks the sentinels through clients of its own. Closing it closed its pool and
    left those open: every reload left a connection to each sentinel per client."""
    ports = [port for port, _, _ in sentinel.sentinels]
    tier = RedisTier(redis_settings(sentinel.url, mode="sentinel", sentinel_master=MASTER), metrics)
    await tier.put("r.m.t.k", _entry("r.m.t.k"))
    assert await tier.get("r.m.t.k") is not None
    assert _askers(ports[0]) == 1  # (the first answered: the others were not asked)
    await tier.aclose()

    def closed() -> bool:
        return [_askers(p) for p in ports] == [0, 0, 0]

    await _until("the closed client's connections to the sentinels stayed open", _sync(closed))


def _state(proc: subprocess.Popen[bytes]) -> str:
    with open(f"/proc/{proc.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def test_a_frozen_sentinel_and_primary_the_promoted_replica_serves_the_tier(
    sentinel: RedisSentinelServers, metrics: CacheMetrics
) -> None:
    """redis-py asks the sentinels in turn, each within its socket timeout (the connect timeout,
    0.25 s), and asks a sentinel that answered first from then on. A frozen sentinel never
    answers, and the op deadline (0.1 s) cancelled every new connection's question to it before
    that timeout fired: the next sentinel was never asked, so after the failover no connection
    reached the promoted replica (no lookup, store, lease or purge) while it stayed frozen."""
    settings = redis_settings(sentinel.url, mode="sentinel", sentinel_master=MASTER)
    writer, reader = RedisTier(settings, metrics), RedisTier(settings, metrics)
    keys = [f"r.m.t.k{i}" for i in range(30)]
    first_sentinel = sentinel.sentinels[0]  # the URL's first: the one asked first
    old = sentinel.primary
    replica = sentinel.replica
    assert old.proc is not None and replica is not None
    try:
        for k in keys:
            await writer.put(k, _entry(k))
        assert [g.body.decode() if g else None for g in await _get(reader, keys)] == keys

        def replicated() -> bool:
            return int(cli(replica.port, "dbsize").strip()) == 30

        await _until("the replica never had every entry", _sync(replicated))
        os.kill(first_sentinel[1].pid, signal.SIGSTOP)
        os.kill(old.proc.pid, signal.SIGSTOP)

        def promoted() -> bool:
            out = cli(sentinel.sentinels[1][0], "sentinel", "get-master-addr-by-name", MASTER)
            return out.split()[1:2] == [str(replica.port)]

        async def failover() -> bool:
            # both tiers go on meanwhile: their deadlines cancel what they send to the frozen
            # primary (and, before, every question to the frozen sentinel), their breakers open
            await writer.put(keys[0], _entry(keys[0]))
            await _get(reader, keys)
            return await asyncio.to_thread(promoted)

        await _until("the sentinels never promoted the replica", failover)

        async def shared_hits() -> bool:
            got = await _get(reader, keys)
            return [g.body.decode() if g else None for g in got] == keys

        await _until("no shared hit from the promoted replica", shared_hits)

        async def stores() -> bool:
            await writer.put("r.m.t.fresh", _entry("r.m.t.fresh"))
            got = await reader.get("r.m.t.fresh")
            return got is not None and got.body == b"r.m.t.fresh"

        await _until("no store reached the promoted replica", stores)

        async def leases() -> bool:
            token = await writer.acquire_lease("r.m.t.fresh", 30_000)
            return bool(token) and await reader.lease_held("r.m.t.fresh")

        await _until("no lease taken on the promoted replica", leases)

        async def purged() -> bool:
            try:
                await writer.purge(Selector(route_h="r"))
            except Exception:
                return False
            return all(g is None for g in await _get(reader, [*keys, "r.m.t.fresh"]))

        await _until("the purge never reached the promoted replica", purged)
        # all of it while the old primary and the first sentinel were still frozen
        assert _frozen(old) and _state(first_sentinel[1]) in ("T", "t")
    finally:
        await writer.aclose()
        await reader.aclose()
