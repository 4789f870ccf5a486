"""Records in the purge stream that no process wrote (XADD by hand, another version): the tail
skips each one, counts and logs it once, and reads on; a real purge after them still lands.

Before: a record without the selector fields read as a purge of everything, so one junk XADD
emptied the memory tier of every process on the Redis; one with a field that was not UTF-8
failed the tail's read, counted as a Redis error and logged as a stream outage (then a
recovery), with the tail backing off. A record whose apply fails because Redis does is not
junk: the tail reads it again until it lands (before, it was logged and skipped, the delete lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest
from redis.asyncio import Redis

from cache import Cache, CacheEntry, request_directives
from cache.keys import Selector
from cache.purge_fanout import PurgeFanout
from cache.redis_client import connect
from tests.support.redis_acl import acl_user
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, cache_pair, route, until
from tests.unit.cache.conftest import redis_settings

JUNK: list[dict[str, str | bytes]] = [
    {"x": "y"},  # no selector at all
    {"o": "elsewhere", "r": "", "m": ""},  # no tenant field
    {"o": b"\xff\xfe", "r": "", "m": "", "t": ""},  # an origin that is not UTF-8
    {"o": "elsewhere", "r": "", "m": "", "t": "", "k": b"\xff"},  # a key that is not UTF-8
]


async def _denied(admin: Redis, command: str) -> None:
    """Until Redis has refused `command` to a client (its ACL LOG)."""
    for _ in range(1000):
        log: list[dict[str, object]] = await admin.acl_log()
        if any(e.get("object") == command for e in log):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"Redis never refused {command}")


def _count(cache: Cache, name: str, *labels: str) -> float:
    value: float = getattr(cache.metrics, name).labels(*labels)._value.get()
    return value


async def test_junk_purge_records_are_skipped_once_each_and_a_real_purge_still_lands(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = Redis.from_url(redis_server.url)
    caplog.set_level(logging.WARNING, "latentgate.cache.purge")
    try:
        async with cache_pair(redis_server.url) as (a, b):
            assert a.fanout is not None
            ra, rb = route(a), route(b)
            kept = rb.key("m", {**FIELDS, "path": "/items/2"}, ALICE)
            gone = rb.key("m", FIELDS, ALICE)
            for k in (kept, gone):
                assert await rb.store(k, CacheEntry(200, [], body=b"v", ttl=60.0))
                assert await ra.lookup(k, request_directives(None)) is not None  # A's memory

            fanout = a.fanout
            ids = [(await admin.xadd(fanout.stream_key, f)).decode() for f in JUNK]
            applied = fanout.applied
            await rb.invalidate(gone)  # a real purge, after the junk
            await until("A never applied it", lambda: fanout.applied > applied)

            assert a.memory.get_now(gone.value) is None
            assert a.memory.get_now(kept.value) is not None  # before: every entry went
            assert _count(a, "stream_skips", "purge") == len(JUNK)
            assert _count(a, "redis_errors", "purge_fanout", "UnicodeDecodeError") == 0
            logged = [r.getMessage() for r in caplog.records]
            assert not [m for m in logged if "stream tail" in m]  # no outage, no recovery
            # once by each tail (A's and B's)
            assert [sum(i in m for m in logged) for i in ids] == [2] * len(JUNK)
    finally:
        await admin.aclose()


async def test_a_purge_whose_apply_redis_fails_is_applied_once_redis_answers(
    redis_server: RedisServer,
) -> None:
    """A reader whose apply deletes in Redis itself (as a pending invalidation asks), on a
    client that Redis refuses DEL for a while."""
    settings = redis_settings(redis_server.url)
    errors: Counter[str] = Counter()
    async with acl_user(redis_server, "del") as user:
        applier = Redis.from_url(user.url)

        async def apply(selector: Selector, _pending: bool) -> int:
            return int(await applier.delete(selector.key or ""))

        here = PurgeFanout(connect(settings, socket_timeout=2, max_connections=2), apply)
        there = PurgeFanout(
            connect(settings, socket_timeout=2, max_connections=2),
            apply,
            on_error=lambda kind: errors.update([kind]),
        )
        here.stream_key = there.stream_key = f"{{{settings.key_prefix}}}purge"
        await there.prime(5.0)
        there.start()
        try:
            await user.admin.set("victim", b"old")
            assert await here.announce(Selector(key="victim")) == "announced"
            await _denied(user.admin, "del")  # the apply failed: Redis refused its DEL
            await user.allow("del")  # Redis answers again
            await until("the delete was lost", lambda: there.applied == 1)
            assert await user.admin.exists("victim") == 0
            assert errors["NoPermissionError"] >= 1  # counted as the Redis error it is
        finally:
            await there.aclose()
            await here.aclose()
            await applier.aclose()
