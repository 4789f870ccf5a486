"""Redis hygiene of the semantic sync on the default Redis settings (op timeout 100 ms): an idle
stream tail does not time out and warn, and an outage is logged once, not once per add."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest
from redis.asyncio import Redis

from cache.embedder import Embedder
from cache.semantic.sync import RedisSync
from cache.semantic.sync_publisher import SEND_TRIES
from cache.settings import RedisSettings
from tests.semantic.test_sync import new_stage, wait_for
from tests.support.servers import RedisServer


def default_settings(url: str) -> RedisSettings:
    # the shipped defaults: op timeout 0.1 s, below the tail's 500 ms blocking read
    return RedisSettings(url=url, key_prefix=f"h{time.monotonic_ns()}:")


async def test_idle_tail_on_default_timeouts_neither_fails_nor_warns(
    redis_server: RedisServer, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    settings = default_settings(redis_server.url)
    assert settings.timeouts.op < 0.5
    a, b = new_stage(embedder), new_stage(embedder)
    sa, sb = RedisSync.from_settings(a, settings), RedisSync.from_settings(b, settings)
    caplog.set_level(logging.WARNING, logger="latentgate.semantic.sync")
    await sa.start()
    await sb.start()
    try:
        await asyncio.sleep(1.6)  # three idle blocking reads
        await a.add("ns", "How do I reset my password?", "key-1", ttl=60)
        await wait_for(lambda: len(b.entries) == 1, limit=2.0)
        assert b.metrics.sync.labels("tail", "error")._value.get() == 0
        assert not [r for r in caplog.records if r.name == "latentgate.semantic.sync"]
    finally:
        await sa.aclose()
        await sb.aclose()


async def test_outage_is_logged_once_and_counted_per_failure(
    embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer().start()
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, default_settings(server.url), block_ms=100)
    await sync.start()
    caplog.set_level(logging.WARNING, logger="latentgate.semantic.sync")
    try:
        vec = await stage.embed("How do I reset my password?")
        server.kill()
        for i in range(40):
            await stage.add("ns", f"question {i}", f"k{i}", ttl=60, vector=vec)
        await sync.published()  # (publishing is off the request path)
        await asyncio.sleep(0.5)  # the tail fails a few times too
        lines = [r.getMessage() for r in caplog.records]
        assert sum("publishing to Redis failing" in m for m in lines) == 1, lines
        assert sum("stream tail failing" in m for m in lines) == 1, lines
        # each of the 40 tried SEND_TRIES times (in one batch), then given up
        assert stage.metrics.sync.labels("publish", "error")._value.get() == 40 * SEND_TRIES
        assert len(stage.entries) == 40  # kept locally
        server.start()
        await stage.add("ns", "question after", "k-after", ttl=60, vector=vec)
        await sync.published()
        lines = [r.getMessage() for r in caplog.records]
        said = f"publishing to Redis recovered after {40 * SEND_TRIES} failures"
        assert any(said in m for m in lines), lines
    finally:
        await sync.aclose()
        server.stop()


async def test_a_hung_redis_never_holds_an_add_and_bad_records_do_not_stop_a_rebuild(
    embedder: Embedder,
) -> None:
    """A Redis that stops answering (SIGSTOP: no reset, no refusal) used to hold every semantic
    miss for the publishing client's socket timeout; publishing is now off the request path.
    And a record this version cannot read, left in the shared hash, is skipped at start-up
    instead of leaving the process without a semantic cache."""
    server = RedisServer().start()
    settings = default_settings(server.url)
    stage = new_stage(embedder)
    sync = RedisSync.from_settings(stage, settings, block_ms=100)
    await sync.start()
    published = stage.metrics.sync.labels("publish", "ok")
    failed = stage.metrics.sync.labels("publish", "error")
    try:
        vec = await stage.embed("How do I reset my password?")
        await stage.add("ns", "How do I reset my password?", "k-ok", ttl=60, vector=vec)
        await sync.published()
        assert published._value.get() == 1
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        await stage.add("ns", "How do I change my email?", "k-hung", ttl=60, vector=vec)
        # the add returned before Redis could answer either way: it did not wait on it
        assert (published._value.get(), failed._value.get()) == (1, 0)
        assert len(stage.entries) == 2
        await sync.published()  # the publisher's own waits end in its socket timeout
        assert failed._value.get() == SEND_TRIES
        os.kill(server.proc.pid, signal.SIGCONT)
        await sync.aclose()

        redis = Redis.from_url(server.url)
        await redis.hset(sync.entries_key, "k-garbage", b"\x93\x01")  # truncated msgpack
        readable = await redis.hlen(sync.entries_key) - 1  # (k-hung too, once Redis resumed)
        await redis.aclose()
        fresh = new_stage(embedder)
        again = RedisSync.from_settings(fresh, settings, block_ms=100)
        assert readable >= 1 and await again.rebuild() == readable
        assert fresh.metrics.sync.labels("rebuild", "skipped")._value.get() == 1
        await again.aclose()
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
