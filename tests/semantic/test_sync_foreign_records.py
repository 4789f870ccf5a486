"""Records of the shared semantic hash and events of its stream that have the right shape but
not this version's field types (junk written into Redis, or another release's layout) are
skipped and counted, at start-up and in the live tail; the readable ones still load. Before,
a record with a null text or a string expiry raised out of the rebuild (`len(None)`,
`str > float`), the process started without a shared index and never joined the fleet's."""

from __future__ import annotations

import time

import msgpack
import numpy as np
from redis.asyncio import Redis

from cache.embedder import Embedder
from cache.semantic.sync import RedisSync
from cache.settings import RedisSettings
from tests.semantic.test_sync import new_stage, wait_for
from tests.support.servers import RedisServer


def _foreign(dim: int) -> dict[str, dict[str, object]]:
    """Records each wrong in one field, by hash field."""
    good = {"ns": "ns", "t": "a question", "v": np.ones(dim, np.float32).tobytes(), "x": 9e9}
    wrong: dict[str, object] = {
        "t": None,
        "x": "9e9",
        "ns": 7,
        "k": 3,
        "b": "high",
        "v": np.full(dim, np.nan, np.float32).tobytes(),
    }
    return {f"bad-{f}": {**good, "k": f"bad-{f}", f: value} for f, value in wrong.items()}


async def test_records_of_another_layout_are_skipped_and_the_rest_load(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    settings = RedisSettings(url=redis_server.url, key_prefix=f"f{time.monotonic_ns()}:")
    writer = new_stage(embedder)
    first = RedisSync.from_settings(writer, settings, block_ms=100)
    redis = Redis.from_url(redis_server.url)
    try:
        vec = await writer.embed("How do I reset my password?")
        await first.start()
        await writer.add("ns", "How do I reset my password?", "k-ok", ttl=60, vector=vec)
        await first.published()
        for field, record in _foreign(embedder.dim).items():
            await redis.hset(first.entries_key, field, msgpack.packb(record))

        fresh = new_stage(embedder)
        again = RedisSync.from_settings(fresh, settings, block_ms=100)
        try:
            await again.start()  # rebuilds, then tails
            assert again.stage.replicator is again
            assert next(iter(fresh.entries.values())).exact_key == "k-ok"
            assert len(fresh.entries) == 1
            skipped = fresh.metrics.sync.labels("rebuild", "skipped")._value.get()
            assert skipped == len(_foreign(embedder.dim))

            # the same records announced live, and events without their key or bar: the tail
            # skips them and goes on to apply what follows
            for field in _foreign(embedder.dim):
                await redis.xadd(first.stream_key, {"o": "elsewhere", "op": "add", "k": field})
            await redis.xadd(first.stream_key, {"o": "elsewhere", "op": "del"})
            await redis.xadd(first.stream_key, {"o": "elsewhere", "op": "bar", "k": "k-ok"})
            await redis.xadd(
                first.stream_key, {"o": "elsewhere", "op": "bar", "k": "k-ok", "b": "x"}
            )
            await writer.add("ns", "How do I change my email?", "k-later", ttl=60, vector=vec)
            await first.published()
            await wait_for(lambda: len(fresh.entries) == 2, limit=5.0)
            assert fresh.metrics.sync.labels("tail", "error")._value.get() == 0
            assert fresh.metrics.sync.labels("apply", "skipped")._value.get() == 9
        finally:
            await again.aclose()
    finally:
        await first.aclose()
        await redis.aclose()
