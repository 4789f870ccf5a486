"""gateway/worker_drops.py on a real unix socket: a sibling's one-key drop reaches this worker's
memory tier (that key alone), a purge's selector drops what it names and no more; anything else
is a JSON 400, not a drop."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from cache.codec import CacheEntry
from cache.keys import Selector
from cache.tiers.memory import MemoryTier
from gateway import worker_drops
from gateway.worker_metrics import Workers

KEY = "r0.m0.t0.alice"
OTHER = "r0.m0.t1.bob"


@asynccontextmanager
async def sibling(keys: tuple[str, ...], index: int) -> AsyncIterator[tuple[MemoryTier, str]]:
    """Worker `index` listening on its socket, its memory holding `keys`: (memory, the sockets'
    directory)."""
    memory = MemoryTier(1 << 20)
    for k in keys:
        memory.put_now(k, CacheEntry(200, [], body=b"{}", ttl=60.0))
    directory = tempfile.mkdtemp(prefix="lg-drops-")
    app = web.Application()
    app.router.add_post(worker_drops.PATH, worker_drops.handler(memory.purge))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, Workers(index, index + 1, directory).socket(index)).start()
    try:
        yield memory, directory
    finally:
        await runner.cleanup()


async def test_a_siblings_invalidation_drops_that_key_alone() -> None:
    async with sibling((KEY, OTHER), 1) as (memory, directory):
        # worker 0 tells its sibling, worker 1
        told = await worker_drops.SiblingDrops(Workers(0, 2, directory)).announce(
            Selector.of_value(KEY) or Selector()
        )
        assert told == {"1": 1}
        assert memory.get_now(KEY) is None and memory.get_now(OTHER) is not None
        connector = aiohttp.UnixConnector(path=Workers(0, 2, directory).socket(1))
        async with aiohttp.ClientSession(connector=connector) as s:
            bad = (
                b"not json",
                b"[]",
                b'{"key": "x"}',
                b'{"route_h": 1, "key": ""}',
                # a key whose hashes are another tenant's: it would drop bob's under alice's name
                b'{"route_h": "r0", "model_h": "m0", "tenant_h": "t0", "key": "r0.m0.t1.bob"}',
                b'{"route_h": "", "model_h": null, "tenant_h": null, "key": null}',
                b"[" * 100_000,  # nested past the JSON decoder's stack: a 400, not a 500
            )
            for body in bad:
                async with s.post("http://worker" + worker_drops.PATH, data=body) as r:
                    assert r.status == 400 and "error" in await r.json()
        assert memory.get_now(OTHER) is not None


async def test_a_siblings_purge_drops_what_its_selector_names_and_no_more() -> None:
    keys = ("r0.m0.t0.a", "r0.m0.t0.b", "r0.m0.t1.c", "r1.m0.t0.d")
    async with sibling(keys, 1) as (memory, directory):
        # worker 2 purges tenant t0 on route r0; worker 1 answers, worker 0 has no socket yet
        purging = worker_drops.SiblingDrops(Workers(2, 3, directory))
        told = await purging.announce(Selector("r0", None, "t0"))
        assert told["1"] == 2 and str(told["0"]).startswith("not told")
        assert [k for k in keys if memory.get_now(k) is not None] == ["r0.m0.t1.c", "r1.m0.t0.d"]
        told = await purging.announce(Selector())
        assert told["1"] == 2 and all(memory.get_now(k) is None for k in keys)
