"""cache.stream_gap.missed against a real Redis: which stream states mean a tail missed events.

Each case builds the stream a tail would meet when it comes back and asks about the id it read
last. A stream made anew after the tail read from the old one (Redis restarted empty, or was
flushed, and the fleet wrote again before this tail's next read) has never lost an entry of its
own, yet the events of the old one that the tail never read are gone: before, that counted as
nothing missed (`entries-added == length` answered for any tail position).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from cache.stream_gap import START, missed
from tests.support.servers import RedisServer


@pytest.fixture
async def r(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


def _key() -> str:
    return f"gap-{uuid.uuid4().hex[:8]}"


async def _add(r: Redis, key: str, n: int, maxlen: int | None = None) -> list[str]:
    ids = []
    for i in range(n):
        ident = await r.xadd(key, {"i": i}, maxlen=maxlen, approximate=False)
        ids.append(ident.decode())
    return ids


async def test_a_missing_stream_is_a_gap_only_for_a_tail_that_had_read(r: Redis) -> None:
    key = _key()
    assert not await missed(r, key, START)
    assert await missed(r, key, "1-0")


async def test_a_stream_never_trimmed_misses_nothing(r: Redis) -> None:
    key = _key()
    ids = await _add(r, key, 5)
    assert not await missed(r, key, START)
    assert not await missed(r, key, ids[0])
    assert not await missed(r, key, ids[-1])


async def test_trimmed_past_the_tail_or_not(r: Redis) -> None:
    key = _key()
    ids = await _add(r, key, 10)
    await r.xtrim(key, maxlen=5, approximate=False)
    assert await missed(r, key, START)
    assert await missed(r, key, ids[3])  # ids[4] was trimmed unread
    assert not await missed(r, key, ids[5])  # ids[5] is still the first entry
    assert not await missed(r, key, ids[-1])


async def test_a_stream_made_anew_after_the_tail_read_from_the_old_one_is_a_gap(
    r: Redis,
) -> None:
    key = _key()
    # (ids given: added within one millisecond, the new stream's would equal the old one's)
    for ident in ("1000-0", "1000-1", "1000-2"):
        await r.xadd(key, {"i": 0}, id=ident)
    read = "1000-0"  # the tail read the first; the two after it it never read
    await r.delete(key)  # Redis restarted empty (or was flushed)
    for ident in ("2000-0", "2000-1"):  # the fleet writes again before the tail's next read
        await r.xadd(key, {"i": 0}, id=ident)
    assert await missed(r, key, read)  # before: False (the new stream never lost an entry)
    assert not await missed(r, key, START)  # a tail that starts here reads it all


async def test_a_stream_trimmed_to_nothing_past_the_tail_is_a_gap(r: Redis) -> None:
    key = _key()
    ids = await _add(r, key, 4)
    await r.xtrim(key, maxlen=0, approximate=False)
    assert await missed(r, key, ids[1])  # before: False (Redis 7 records 0-0 as its first id)
    assert await missed(r, key, START)
    assert not await missed(r, key, ids[-1])  # it had read all there was


async def test_a_stream_behind_the_tail_is_a_gap(r: Redis) -> None:
    """A failover to a replica that had not received the last events, or a stream made anew by a
    host whose clock is behind: the stream never got as far as the tail read. Its next events
    would be older than the tail's position, and XREAD from there would skip them."""
    key = _key()
    await r.xadd(key, {"i": 0}, id="1000-0")
    await r.xadd(key, {"i": 1}, id="1000-1")
    assert await missed(r, key, "2000-0")  # the tail had read up to 2000-0 on the old primary
    assert not await missed(r, key, "1000-1")
