"""The Redis tier in sentinel mode on real sentinels (cache.sentinel_pool): a closed client
leaves no connection to them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.redis_topologies import MASTER, RedisSentinelServers, cli
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_cluster_frozen_primary import _entry, _sync, _until


@pytest.fixture
def sentinel() -> Iterator[RedisSentinelServers]:
    topo = RedisSentinelServers().start()
    try:
        yield topo
    finally:
        procs = [s.proc for s in (topo.primary, topo.replica) if s is not None]
        for proc in [*procs, *(p for _, p, _ in topo.sentinels)]:
            if proc is not None and proc.poll() is None:  # a frozen one is woken, then stopped
                os.kill(proc.pid, signal.SIGCONT)
        topo.stop()


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
