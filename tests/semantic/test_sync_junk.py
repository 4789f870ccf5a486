"""Events in the semantic sync stream that no process of this version wrote (XADD by hand,
another version): the tail skips each one, counts and logs it once, and reads on.

Before: an add whose origin was not UTF-8 failed its batch before the tail's position moved, so
the tail read the same batch again for ever (counted and logged as a Redis outage), and the
process never received another add, removal or bar from the fleet.
"""

from __future__ import annotations

import logging
import time

import pytest
from redis.asyncio import Redis

from cache.embedder import Embedder
from cache.semantic.records import entry_id
from cache.semantic.sync import RedisSync
from tests.semantic.test_sync import Q, new_stage, wait_for
from tests.support.servers import RedisServer

JUNK: list[dict[str, str | bytes]] = [
    {"o": b"\xff\xfe", "op": "add", "k": "reset"},  # an origin that is not UTF-8
    {"op": "del"},  # no key
    {"op": "merge", "k": "reset"},  # an op this version does not know
    {"op": "bar", "k": "reset", "b": "high"},  # a bar that is no number
    {"op": "bar", "k": "reset", "b": "nan"},
    {"op": "add", "e": b"not a record"},  # an inline record (the older events) it cannot read
]


async def test_junk_events_are_skipped_once_each_and_the_tail_reads_on(
    redis_server: RedisServer, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"j{time.monotonic_ns()}:"
    admin, r1, r2 = (Redis.from_url(redis_server.url) for _ in range(3))
    a, b = new_stage(embedder), new_stage(embedder)
    sa, sb = RedisSync(a, r1, prefix, block_ms=100), RedisSync(b, r2, prefix, block_ms=100)
    await sa.start()
    await sb.start()
    caplog.set_level(logging.WARNING, "latentgate.semantic.sync")
    try:
        ids = [(await admin.xadd(sa.stream_key, fields)).decode() for fields in JUNK]
        await b.add("ns", Q, "reset", ttl=60)  # after the junk
        await wait_for(lambda: entry_id("reset") in a.entries, 10)  # before: never

        assert sa._m.labels("apply", "skipped")._value.get() == len(JUNK)
        assert sa._m.labels("tail", "error")._value.get() == 0  # junk is not an outage
        assert a.entries[entry_id("reset")].bar == 0.0  # no junk bar was applied
        logged = [r.getMessage() for r in caplog.records]
        # once by each tail (A's and B's): neither read one again
        assert [sum(i in m for m in logged) for i in ids] == [2] * len(JUNK)
    finally:
        await sa.aclose()
        await sb.aclose()
        for r in (admin, r1, r2):
            await r.aclose()
