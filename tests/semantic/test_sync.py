"""Two semantic stages share entries through a real Redis; a Redis outage leaves lookups local."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.embedder import Embedder
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.semantic.verifier import MlpVerifier
from tests.support.servers import RedisServer

Q = "How do I reset my password?"
PARA = "How can I reset my password?"


def new_stage(embedder: Embedder) -> SemanticStage:
    return SemanticStage(
        embedder, VectorIndex(embedder.dim, device="cpu"), SemanticMetrics(CollectorRegistry())
    )


async def wait_for(cond: Callable[[], bool], limit: float = 1.0) -> float:
    t = time.perf_counter()
    while not cond():
        assert time.perf_counter() - t < limit, "not replicated within the time limit"
        await asyncio.sleep(0.01)
    return time.perf_counter() - t


async def test_add_and_remove_replicate_within_a_second(
    redis_server: RedisServer, embedder: Embedder, verifier: MlpVerifier
) -> None:
    prefix = f"t{time.monotonic_ns()}:"
    r1, r2 = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    a, b = new_stage(embedder), new_stage(embedder)
    sa, sb = RedisSync(a, r1, prefix, block_ms=100), RedisSync(b, r2, prefix, block_ms=100)
    await sa.start()
    await sb.start()
    try:
        await a.add("ns", Q, "key-1", ttl=60)
        await wait_for(lambda: len(b.entries) == 1)
        hit = await b.lookup("ns", PARA, verifier)
        assert hit is not None and hit.exact_key == "key-1"
        # A wrong-hit report through one process raises that entry's bar in the other too.
        assert await b.report_wrong("key-1", hit.score)
        await wait_for(lambda: next(iter(a.entries.values())).bar > hit.score)
        assert await a.lookup("ns", PARA, verifier) is None
        await b.remove_key("key-1")
        await wait_for(lambda: not a.entries)
        # A third process starting now rebuilds from Redis: only live entries come back.
        await a.add("ns", "What is the capital of France?", "key-2", ttl=60)
        await a.report_wrong("key-2", 0.5)
        c = new_stage(embedder)
        r3 = Redis.from_url(redis_server.url)
        sc = RedisSync(c, r3, prefix)
        await sc.start()
        assert {e.exact_key for e in c.entries.values()} == {"key-2"}
        assert next(iter(c.entries.values())).bar > 0.5  # the bar survives a rebuild
        await sc.aclose()
        await r3.aclose()
    finally:
        await sa.aclose()
        await sb.aclose()
        await r1.aclose()
        await r2.aclose()


async def test_redis_outage_keeps_local_lookups(embedder: Embedder, verifier: MlpVerifier) -> None:
    server = RedisServer().start()
    redis = Redis.from_url(server.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    stage = new_stage(embedder)
    sync = RedisSync(stage, redis, "o:", block_ms=100)
    await sync.start()
    try:
        await stage.add("ns", Q, "before", ttl=60)
        server.kill()
        await stage.add("ns", "What is the capital of France?", "during", ttl=60)
        await sync.published()  # (publishing is off the request path)
        assert (await stage.lookup("ns", PARA, verifier)) is not None
        assert (await stage.lookup("ns", "What's the capital of France?", verifier)) is not None
        assert stage.metrics.sync.labels("publish", "error")._value.get() >= 1
    finally:
        await sync.aclose()
        await redis.aclose()
        server.stop()
