"""Replicas that answer with an endless body (a bug, a URL that points at a file server, a
hostile replica), to the places that read an answer whole rather than stream it: each stops
reading past its cap and closes the connection, so the replica manages to send little more
than the cap, never the 256 MiB it offers."""

from __future__ import annotations

import asyncio

import pytest

from backends.remote.health import HEALTH_BODY_CAP, HealthChecker
from backends.remote.metrics import RemoteMetrics
from backends.remote.replica import Replica
from backends.remote.transports.factory import make_transport
from backends.settings import HealthCheckSettings, PoolLimits, RemoteBackendSettings
from tests.support.endless_replica import IN_FLIGHT, EndlessReplica


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_a_health_check_reads_no_more_than_its_cap_and_the_status_decides(
    client: str,
) -> None:
    """Before, the check read the whole body: an endless one until the check's timeout, held
    in memory meanwhile, and the replica then failed its check although it answered 200."""
    replica = EndlessReplica(200)
    url = await replica.raw.start()
    settings = RemoteBackendSettings(replicas=[url], pool=PoolLimits(http_client=client))
    # a timeout far beyond what reading the cap takes: the cap, not the clock, ends the read
    check = HealthCheckSettings(path="/health", timeout_s=120, unhealthy_threshold=1)
    r = Replica(url, make_transport(url, settings))
    r.healthy = False
    checker = HealthChecker("pool", [r], check, RemoteMetrics(), lambda _: None)
    try:
        assert await checker.check(r) is True
        assert r.healthy
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert HEALTH_BODY_CAP < replica.sent < HEALTH_BODY_CAP + IN_FLIGHT
    finally:
        await r.transport.aclose()
        await replica.raw.stop()


async def test_a_health_check_with_an_endless_error_body_fails_on_its_status() -> None:
    replica = EndlessReplica(503)
    url = await replica.raw.start()
    settings = RemoteBackendSettings(replicas=[url])
    check = HealthCheckSettings(path="/health", timeout_s=120, unhealthy_threshold=1)
    r = Replica(url, make_transport(url, settings))
    checker = HealthChecker("pool", [r], check, RemoteMetrics(), lambda _: None)
    try:
        assert await checker.check(r) is False
        assert not r.healthy
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert replica.sent < HEALTH_BODY_CAP + IN_FLIGHT
    finally:
        await r.transport.aclose()
        await replica.raw.stop()
