"""gateway/worker_drops.py on a real unix socket: a sibling's one-key drop reaches this worker's
memory tier (that key alone); anything else is a JSON 400, not a drop."""

from __future__ import annotations

import tempfile

import aiohttp
from aiohttp import web

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.tiers.memory import MemoryTier
from gateway import worker_drops
from gateway.worker_metrics import Workers

KEY = "r0.m0.t0.alice"
OTHER = "r0.m0.t1.bob"


async def test_a_siblings_invalidation_drops_that_key_alone() -> None:
    memory = MemoryTier(1 << 20)
    for k in (KEY, OTHER):
        memory.put_now(k, CacheEntry(200, [], body=b"{}", ttl=60.0))
    workers = Workers(1, 2, tempfile.mkdtemp(prefix="lg-drops-"))
    app = web.Application()
    app.router.add_post(worker_drops.PATH, worker_drops.handler(memory.purge))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, workers.socket(1)).start()
    try:
        # worker 0 tells its sibling, worker 1
        await worker_drops.SiblingDrops(Workers(0, 2, workers.directory)).announce(
            Selector.of_value(KEY) or Selector()
        )
        assert memory.get_now(KEY) is None and memory.get_now(OTHER) is not None
        connector = aiohttp.UnixConnector(path=workers.socket(1))
        async with aiohttp.ClientSession(connector=connector) as s:
            for body in (b"not json", b"[]", b'{"key": "x"}', b'{"route_h": 1, "key": ""}'):
                async with s.post("http://worker" + worker_drops.PATH, data=body) as r:
                    assert r.status == 400 and "error" in await r.json()
        assert memory.get_now(OTHER) is not None
    finally:
        await runner.cleanup()
