"""A process whose semantic sync tail was cut off from Redis while the stream's length cap
trimmed the events it had not read.

Before: the tail resumed from its last id and never learnt what was trimmed. A wrong-hit bar that
another process raised on an entry did not reach it (it went on serving that entry to the
paraphrases the report had ruled out), and the entries added meanwhile were missing until its
next start. Now the tail sees the gap (cache.stream_gap) and rebuilds from the shared hash, whose
records carry their bars. The rebuild also drops the local entries the hash no longer holds
(removed elsewhere while this process was cut off), but not the ones this process added and
could not publish.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

import cache.semantic.sync_publisher as publisher_module
from cache.embedder import Embedder
from cache.semantic.records import entry_id
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.semantic.verifier import MlpVerifier
from cache.settings import RedisSettings
from tests.semantic.test_sync import PARA, new_stage, wait_for
from tests.support.redis_acl import acl_user
from tests.support.servers import RedisServer


@pytest.fixture
async def user(redis_server: RedisServer) -> AsyncIterator[tuple[str, str, Redis]]:
    async with acl_user(redis_server) as u:
        yield u.url, u.name, u.admin


def _gaps(sync: RedisSync) -> float:
    return sync._m.labels("tail", "gap")._value.get()


@asynccontextmanager
async def _pair_cut_off(
    redis_server: RedisServer, embedder: Embedder, user: tuple[str, str, Redis]
) -> AsyncIterator[tuple[SemanticStage, RedisSync, SemanticStage, RedisSync, np.ndarray]]:
    """A (on the user's URL) and B share an index; A has read B's first add, then its XREADs
    are refused (A is cut off) until the test allows them again."""
    url, name, admin = user
    prefix = f"g{time.monotonic_ns()}:"
    a, b = new_stage(embedder), new_stage(embedder)
    sa = RedisSync.from_settings(a, RedisSettings(url=url, key_prefix=prefix), block_ms=100)
    sb = RedisSync.from_settings(b, RedisSettings(url=redis_server.url, key_prefix=prefix))
    await sa.start()
    await sb.start()
    try:
        vec = await b.embed("How do I reset my password?")
        await b.add("ns", "How do I reset my password?", "reset", ttl=3600, vector=vec)
        await wait_for(lambda: entry_id("reset") in a.entries, 5)
        await wait_for(lambda: not sa._check_gap, 5)
        await admin.execute_command("ACL", "SETUSER", name, "-xread")  # A is cut off
        await wait_for(lambda: sa._check_gap, 10)
        yield a, sa, b, sb, vec
    finally:
        await sa.aclose()
        await sb.aclose()


@pytest.mark.parametrize("trimmed", [True, False], ids=["trimmed", "within-the-cap"])
async def test_a_tail_cut_off_past_the_cap_rebuilds_and_gets_the_bars_it_missed(
    redis_server: RedisServer,
    embedder: Embedder,
    user: tuple[str, str, Redis],
    monkeypatch: pytest.MonkeyPatch,
    trimmed: bool,
) -> None:
    # the real cap trims at 200,000 events; a small one trims the same way (XADD MAXLEN ~)
    monkeypatch.setattr(publisher_module, "STREAM_MAXLEN", 100 if trimmed else 10_000)
    _, name, admin = user
    async with _pair_cut_off(redis_server, embedder, user) as (a, sa, b, sb, vec):
        assert await b.report_wrong("reset", 0.95)  # B's client: that hit was wrong
        await b.add("ns", "What is a cache?", "cache", ttl=3600)
        for i in range(400):  # a busy fleet goes on adding
            await b.add("ns", f"filler question {i}", f"filler-{i}", ttl=3600, vector=vec)
        await sb.published()
        await admin.execute_command("ACL", "SETUSER", name, "+xread")

        await wait_for(lambda: len(a.entries) == len(b.entries), 20)
        assert a.entries[entry_id("reset")].bar == b.entries[entry_id("reset")].bar > 0.95
        assert entry_id("cache") in a.entries
        assert _gaps(sa) == (1 if trimmed else 0)


async def test_a_rebuild_that_fails_midway_is_done_again(
    redis_server: RedisServer,
    embedder: Embedder,
    user: tuple[str, str, Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis fails while the tail rebuilds after a gap (likely: a gap follows an outage).
    Before: the rebuild had moved last_id to the stream's end before it read the hash, so the
    retry read on from there, found no gap, and the records the failed scan had not reached
    stayed missing until the process restarted."""
    monkeypatch.setattr(publisher_module, "STREAM_MAXLEN", 100)
    _, name, admin = user
    async with _pair_cut_off(redis_server, embedder, user) as (a, sa, b, sb, vec):
        for i in range(400):  # trimmed past A's position
            await b.add("ns", f"filler question {i}", f"filler-{i}", ttl=3600, vector=vec)
        await sb.published()

        real, failed = sa.shared.records, []

        async def records_failing_once(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            n = 0
            async for entry in real(*args, **kwargs):
                if not failed and n == 5:
                    failed.append(True)
                    raise ConnectionError("Redis went away mid-rebuild")
                n += 1
                yield entry

        monkeypatch.setattr(sa.shared, "records", records_failing_once)
        await admin.execute_command("ACL", "SETUSER", name, "+xread")
        await wait_for(lambda: bool(failed), 20)
        await b.add("ns", "What is a cache?", "cache", ttl=3600)  # after the failed rebuild
        await sb.published()
        await wait_for(lambda: entry_id("cache") in a.entries, 20)  # the tail read on past it
        assert set(a.entries) == set(b.entries)  # before: the fillers the scan had not reached


async def test_a_tail_cut_off_past_the_cap_drops_what_the_others_removed_and_keeps_its_own(
    redis_server: RedisServer,
    embedder: Embedder,
    verifier: MlpVerifier,
    user: tuple[str, str, Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While A is cut off, B removes an entry (a purge, a stale payload) and the cap trims the
    removal away; A adds one of its own that it cannot publish (its writes are refused too).
    Before: A's gap rebuild only added what the hash held, and A went on serving the removed
    entry as a semantic hit that every other process had stopped serving."""
    monkeypatch.setattr(publisher_module, "STREAM_MAXLEN", 100)
    _, name, admin = user
    async with _pair_cut_off(redis_server, embedder, user) as (a, sa, b, sb, vec):
        hit = await a.lookup("ns", PARA, verifier)
        assert hit is not None and hit.exact_key == "reset"
        await admin.execute_command("ACL", "SETUSER", name, "-hset")  # A cannot publish
        await a.add("ns", "What is the capital of France?", "paris", ttl=3600)
        await sa.published()
        assert sa._m.labels("publish", "error")._value.get() >= 1
        await b.remove_key("reset")
        for i in range(400):  # trimmed past A's position: B's removal with it
            await b.add("fill", f"filler question {i}", f"filler-{i}", ttl=3600, vector=vec)
        await sb.published()
        assert await b.lookup("ns", PARA, verifier) is None
        cut_at = sa.last_id
        await admin.execute_command("ACL", "SETUSER", name, "+xread", "+hset")

        await wait_for(lambda: sa.last_id != cut_at, 20)  # rebuilt (it moves once done)
        assert entry_id("filler-399") in a.entries
        assert _gaps(sa) == 1
        assert await a.lookup("ns", PARA, verifier) is None  # before: "reset", removed
        own = await a.lookup("ns", "What's the capital of France?", verifier)
        assert own is not None and own.exact_key == "paris"  # never published: kept
