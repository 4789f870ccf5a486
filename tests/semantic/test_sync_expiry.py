"""The shared index's footprint in Redis: the hash holds live records only (each process deletes
expired ones, so it no longer grows by one record per semantic miss for as long as the fleet
runs), and the stream's events name records rather than carrying their vectors."""

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


async def test_expired_records_leave_redis_and_live_ones_stay(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    settings = RedisSettings(url=redis_server.url, key_prefix=f"x{time.monotonic_ns()}:")
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, settings, block_ms=100)
    await sync.start()
    redis = Redis.from_url(redis_server.url)
    try:
        vec = await stage.embed("How do I reset my password?")
        for i in range(3):
            await stage.add("ns", f"question {i}", f"short-{i}", ttl=1, vector=vec)
        await stage.add("ns", "a question kept an hour", "long", ttl=3600, vector=vec)
        await stage.add("ns", "asked again later", "again", ttl=1, vector=vec)
        await sync.published()
        assert await redis.hlen(sync.entries_key) == 5
        # 'again' is stored again, for an hour, after its first copy expired: it stays
        later = time.time() + 5
        await stage.add("ns", "asked again later", "again", ttl=3600, vector=vec)
        await sync.published()

        assert await sync.prune(now=later) == 3
        assert sorted(await redis.hkeys(sync.entries_key)) == [b"again", b"long"]
        assert await sync.prune(now=later) == 0

        # a removed entry leaves both the hash and the expiry set
        await stage.remove_key("long")
        await sync.published()
        assert await redis.hkeys(sync.entries_key) == [b"again"]
        assert await redis.zrange(sync.expiry_key, 0, -1) == [b"again"]
    finally:
        await sync.aclose()
        await redis.aclose()


async def test_records_an_earlier_version_kept_without_an_expiry_are_pruned_after_a_start(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    """A hash written before expiries were kept: the next start gives its records theirs."""
    settings = RedisSettings(url=redis_server.url, key_prefix=f"y{time.monotonic_ns()}:")
    redis = Redis.from_url(redis_server.url)
    probe = RedisSync.from_settings(new_stage(embedder), settings)
    vec = np.asarray(await new_stage(embedder).embed("what is a cache?"), np.float32).tobytes()
    now = time.time()
    for key, expires in (("old-1", now - 10), ("old-2", now - 5), ("live", now + 3600)):
        record = {"ns": "ns", "k": key, "t": key, "v": vec, "x": expires, "b": 0.0}
        await redis.hset(probe.entries_key, key, msgpack.packb(record))
    await probe.aclose()
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, settings, block_ms=100)
    await sync.start()  # rebuild, then the first prune
    try:
        assert len(stage.entries) == 1
        await sync.prune()
        assert await redis.hkeys(sync.entries_key) == [b"live"]
        assert await redis.zcard(sync.expiry_key) == 1
    finally:
        await sync.aclose()
        await redis.aclose()


async def test_a_record_with_a_vector_of_another_width_is_skipped_not_fatal(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    """A record cut short (or written with another width) used to fail the FAISS add inside
    the rebuild, and with it the whole start of the semantic stage's sharing."""
    settings = RedisSettings(url=redis_server.url, key_prefix=f"z{time.monotonic_ns()}:")
    redis = Redis.from_url(redis_server.url)
    stage = new_stage(embedder)
    probe = RedisSync.from_settings(stage, settings)
    vec = np.asarray(await stage.embed("what is a cache?"), np.float32).tobytes()
    later = time.time() + 3600
    for key, v in (("whole", vec), ("cut", vec[:100])):
        record = {"ns": "ns", "k": key, "t": key, "v": v, "x": later, "b": 0.0}
        await redis.hset(probe.entries_key, key, msgpack.packb(record))
    await probe.aclose()
    sync = RedisSync.from_settings(stage, settings, block_ms=100)
    try:
        assert await sync.rebuild() == 1
        assert stage.metrics.sync.labels("rebuild", "skipped")._value.get() == 1
    finally:
        await sync.aclose()
        await redis.aclose()


async def test_stream_events_name_records_and_tails_still_apply_them_in_order(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    """The stream kept STREAM_MAXLEN copies of ~1.7 KB records (~350 MB in a busy fleet)."""
    settings = RedisSettings(url=redis_server.url, key_prefix=f"w{time.monotonic_ns()}:")
    a, b = new_stage(embedder), new_stage(embedder)
    sa = RedisSync.from_settings(a, settings, block_ms=100)
    sb = RedisSync.from_settings(b, settings, block_ms=100)
    await sa.start()
    await sb.start()
    redis = Redis.from_url(redis_server.url)
    try:
        vec = await a.embed("How do I reset my password?")
        for i in range(50):
            await a.add("ns", f"question {i}", f"k{i}", ttl=60, vector=vec)
        await a.remove_key("k7")  # in the same batch as its add, most likely: b never has it
        await sa.published()
        await wait_for(lambda: len(b.entries) == 49, limit=5.0)
        assert {e.exact_key for e in b.entries.values()} == {f"k{i}" for i in range(50)} - {"k7"}
        stream = await redis.memory_usage(sa.stream_key)
        records = await redis.memory_usage(sa.entries_key)
        assert stream is not None and records is not None
        assert stream * 4 < records  # 51 small events against 49 records with their vectors
    finally:
        await sa.aclose()
        await sb.aclose()
        await redis.aclose()


async def test_the_hash_and_stream_of_the_version_before_spaces_are_emptied_after_an_upgrade(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    """Before the keys named the embedder's space, every process used `{<prefix>sem}:entries`
    and `:log`. No process of this version reads or writes them: left alone, the hash stayed in
    Redis at its full size for ever (the growth the expiries were added to end)."""
    prefix = f"z{time.monotonic_ns()}:"
    settings = RedisSettings(url=redis_server.url, key_prefix=prefix)
    redis = Redis.from_url(redis_server.url)
    old = f"{{{prefix}sem}}"
    vec = np.asarray(await new_stage(embedder).embed("what is a cache?"), np.float32).tobytes()
    now = time.time()
    for key, expires in (("old-1", now - 10), ("old-2", now - 5), ("live", now + 3600)):
        record = {"ns": "ns", "k": key, "t": key, "v": vec, "x": expires, "b": 0.0}
        await redis.hset(f"{old}:entries", key, msgpack.packb(record))
    await redis.xadd(f"{old}:log", {"o": "an-old-process", "op": "del", "k": "old-0"}, id="1-0")
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, settings, block_ms=100)
    assert sync.entries_key != f"{old}:entries"  # (the space is in the new keys)
    await sync.start()
    try:
        assert len(stage.entries) == 0  # another space's vectors: never loaded
        await sync.prune()
        assert await redis.hkeys(f"{old}:entries") == [b"live"]
        assert await redis.xlen(f"{old}:log") == 0
        assert await sync.prune(now=now + 7200) == 1  # the live one, once it has expired
        assert not await redis.exists(f"{old}:entries", f"{old}:expiry")
    finally:
        await sync.aclose()
        await redis.aclose()
