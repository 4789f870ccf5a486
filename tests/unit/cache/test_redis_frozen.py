"""The Redis tier on a standalone Redis frozen (SIGSTOP: a hung VM) mid-traffic, then woken
(SIGCONT): lookups miss meanwhile, shared hits come back, and no reply a cancelled command left
behind is ever read as a later command's (redis-py asyncio once did: CVE-2023-28858/28859)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Iterator

import pytest

from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_cluster_frozen_primary import _entry, _get, _until


@pytest.fixture
def frozen_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()  # its own: a freeze would stall every test on a shared one
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


async def test_a_frozen_redis_mixes_up_no_replies_and_serves_again_once_woken(
    frozen_redis: RedisServer, metrics: CacheMetrics
) -> None:
    """40 tasks on two tiers look up batches of distinct keys, and store (some under a lease)
    what missed, while Redis freezes for a while and wakes up: each op cancelled by its deadline
    leaves a command whose reply comes once Redis wakes. Every hit is its own key's entry."""
    settings = redis_settings(frozen_redis.url, breaker={"failures": 1000, "open_s": 0.2})
    tiers = [RedisTier(settings, metrics), RedisTier(settings, metrics)]
    keys = [f"r.m.t.k{i}" for i in range(400)]
    wrong: list[tuple[str, bytes]] = []
    seen = {"hits": 0, "misses": 0}
    stop = asyncio.Event()

    async def client(c: int) -> None:
        tier, rnd = tiers[c % 2], random.Random(c)
        while not stop.is_set():
            batch = rnd.sample(keys, rnd.randint(1, 8))
            for k, got in zip(batch, await _get(tier, batch), strict=True):
                if got is not None:
                    seen["hits"] += 1
                    if got.body != k.encode():
                        wrong.append((k, got.body))
                    continue
                seen["misses"] += 1
                token = await tier.acquire_lease(k, 2000) if c % 3 == 0 else ""
                await tier.put(k, _entry(k))
                if token:
                    await tier.release_lease(k, token)
            await asyncio.sleep(0)

    assert frozen_redis.proc is not None
    pid = frozen_redis.proc.pid
    try:
        for k in keys[:200]:
            await tiers[0].put(k, _entry(k))
        clients = [asyncio.create_task(client(c)) for c in range(40)]
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = dict(seen)

        async def missing() -> bool:  # lookups go on, and miss (no hang)
            await asyncio.sleep(0.2)
            return seen["misses"] > frozen_at["misses"] + 100

        await _until("lookups stopped while Redis was frozen", missing)
        await asyncio.sleep(3.0)  # long enough for hundreds of cancelled commands to pile up
        os.kill(pid, signal.SIGCONT)
        woken = seen["hits"]

        async def hits_again() -> bool:
            await asyncio.sleep(0.2)
            return seen["hits"] > woken + 1000

        await _until("no hit after Redis woke up", hits_again)
        stop.set()
        await asyncio.gather(*clients)
        assert wrong == []

        async def shared() -> bool:  # one tier's store is the other's hit again
            await tiers[0].put("r.m.t.after", _entry("r.m.t.after"))
            got = await tiers[1].get("r.m.t.after")
            return got is not None and got.body == b"r.m.t.after"

        await _until("no shared hit after Redis woke up", shared)
    finally:
        stop.set()
        for t in tiers:
            await t.aclose()
