"""Sentinel whose primary and first sentinel are frozen (SIGSTOP: a hung VM), not killed: the
other two sentinels promote the replica, and two gateways under load share exact and semantic
entries and purge there while both are still frozen (cache.sentinel_pool)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import pytest

from tests.fault.test_redis_modes import NOUNS, chat, exact_shared, load, semantic_shared
from tests.integration.cache.conftest import ADMIN_TOKEN
from tests.semantic.test_gateway import semantic_config
from tests.support.redis_topologies import MASTER, RedisSentinelServers, cli, started_sentinels
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

pytestmark = pytest.mark.slow
GIVE_UP_S = 60.0


@pytest.fixture
def sentinel() -> Iterator[RedisSentinelServers]:
    with started_sentinels() as topo:
        yield topo


def _frozen_pid(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _frozen(server: RedisServer) -> bool:
    assert server.proc is not None
    return _frozen_pid(server.proc.pid)


async def _until(what: str, ok: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not await ok():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def test_a_frozen_sentinel_and_primary_two_gateways_share_on_the_promoted_replica(
    upstream: ServerThread, sentinel: RedisSentinelServers
) -> None:
    """Lookups, stores and leases (the load's misses), semantic publishing and the stream tail,
    and a purge with its fan-out all reach the promoted replica. Before, each new connection's
    question to the frozen sentinel was cancelled by the op deadline before its socket timeout
    let redis-py ask the next one: no shared hit came back while it stayed frozen."""
    cfg = semantic_config(upstream.url, sentinel.url)
    cfg["cache"]["redis"].update(
        mode="sentinel", sentinel_master=MASTER, key_prefix=f"f{uuid.uuid4().hex[:6]}:"
    )
    gws = [GatewayProcess(cfg).start(), GatewayProcess(cfg).start()]
    a, b = gws[0].url, gws[1].url
    try:
        async with aiohttp.ClientSession() as s:

            async def shared() -> bool:
                return await exact_shared(s, a, b)

            await _until("no shared hit before the freeze", shared)
            assert await semantic_shared(s, a, b, NOUNS[0], limit=5.0) is not None

            stop = asyncio.Event()
            running = asyncio.create_task(load(a, b, stop))
            await asyncio.sleep(1.0)
            old = sentinel.primary
            assert old.proc is not None and sentinel.master_port() == old.port
            first = sentinel.sentinels[0]  # the URL's first: the one each client asks first
            os.kill(first[1].pid, signal.SIGSTOP)
            os.kill(old.proc.pid, signal.SIGSTOP)

            def master_port() -> str:
                out = cli(sentinel.sentinels[1][0], "sentinel", "get-master-addr-by-name", MASTER)
                return "".join(out.split()[1:2])

            async def promoted() -> bool:
                return await asyncio.to_thread(master_port) not in ("", str(old.port))

            await _until("the sentinels never promoted the replica", promoted)
            await _until("no shared hit from the promoted replica", shared)
            stop.set()
            statuses = await running
            caught = None
            for noun in NOUNS[1:]:
                try:
                    caught = await semantic_shared(s, a, b, noun, limit=15.0)
                except AssertionError:
                    continue
                if caught is not None:
                    break
            assert caught is not None, "no semantic entry reached the other gateway"
            assert await chat(s, b, "q1") == (200, "hit", "echo(up): q1")

            async def purged() -> bool:
                auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                async with s.post(a + "/admin/cache/purge", json={"all": True}, headers=auth) as r:
                    if r.status != 200:  # 202: Redis did not take it (yet)
                        return False
                return (await chat(s, b, "q1"))[1] == "miss"

            await _until("the purge never reached the promoted replica", purged)
            # all of it while the old primary and the first sentinel were still frozen
            assert _frozen(old) and _frozen_pid(first[1].pid)
            assert set(statuses) == {200}  # (no request failed or hung meanwhile)
    except AssertionError:
        for g in gws:
            print("\n".join(x for x in g.log().splitlines() if " INFO " not in x))
        raise
    finally:
        for g in gws:
            g.stop()
