"""A delete Redis could not take (slow, or the breaker open) is remembered until it lands: this
process does not read the old entry back, a store under the key replaces it, and the delete is
sent, and announced to the other processes, once Redis answers (cache.tiers.undeleted)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from redis.asyncio import Redis

from cache.codec import CacheEntry
from cache.metrics import CacheMetrics
from cache.tiers.redis import RedisTier
from cache.tiers.undeleted import UndeletedKeys
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings

KEY = "r0.m0.t0.k-undeleted"


def _entry(body: bytes) -> CacheEntry:
    return CacheEntry(
        200, [("Content-Type", "application/json")], body=body, ttl=60.0, model="m", kind="chat"
    )


async def _until(check: Callable[[], object], what: str) -> None:
    for _ in range(400):  # 20 s at most
        if await check():  # type: ignore[misc]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within 20 s: {what}")


async def test_a_delete_made_while_redis_is_marked_down_lands_once_it_answers(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """Before: the delete was dropped, and the entry stayed in Redis for every process (and
    for this one once the breaker closed) until its TTL."""
    tier = RedisTier(
        redis_settings(redis_server.url, breaker={"failures": 1, "open_s": 0.3}), metrics
    )
    told: list[list[str]] = []

    async def announce(keys: list[str]) -> None:
        told.append(keys)

    tier.on_late_delete = announce
    probe = Redis.from_url(redis_server.url)
    try:
        await tier.put(KEY, _entry(b'{"old":1}'))
        stored = tier.prefix + KEY
        assert await probe.exists(stored) == 1
        tier.breaker.failure()  # busy elsewhere: its reads timed out, Redis itself is fine
        await tier.delete(KEY)
        assert await probe.exists(stored) == 1  # not sent
        assert metrics.undeleted._value.get() == 1
        assert await tier.get(KEY) is None

        async def gone() -> bool:
            return bool(await probe.exists(stored) == 0)

        await _until(gone, "the remembered delete reaches Redis")
        await _until(lambda: asyncio.sleep(0, result=told == [[KEY]]), "the others are told")
        assert metrics.undeleted._value.get() == 0
        assert tier.breaker.state == 0  # the retry was the probe that closed it
    finally:
        await tier.aclose()
        await probe.aclose()


async def test_a_timed_out_delete_is_not_read_back_and_a_new_answer_replaces_it(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """A delete that timed out (Redis stalled, the breaker still closed) may or may not land.
    Until it is known to have, this process treats the key as deleted; a fresh answer stored
    under it is served from then on."""
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    sleeper = Redis.from_url(redis_server.url)  # no socket timeout: it sleeps the server
    try:
        await tier.put(KEY, _entry(b'{"old":1}'))
        stall = asyncio.ensure_future(sleeper.execute_command("DEBUG", "SLEEP", "0.5"))
        await asyncio.sleep(0.05)
        await tier.delete(KEY)  # times out after the op deadline
        assert KEY in tier.undeleted
        assert await tier.get(KEY) is None  # not the old answer, whatever Redis holds
        await stall
        await tier.put(KEY, _entry(b'{"new":1}'))
        found = await tier.get(KEY)
        assert found is not None and found.body == b'{"new":1}'
        assert KEY not in tier.undeleted
    finally:
        await tier.aclose()
        await sleeper.aclose()


def test_past_the_cap_the_oldest_undelivered_delete_is_forgotten() -> None:
    keys = UndeletedKeys(cap=2)
    assert not keys.add("a") and not keys.add("b")
    assert keys.add("c")  # "a" goes
    assert "a" not in keys and keys.oldest(5) == ["b", "c"]
    keys.add("b")  # remembered again: now the newest
    assert keys.oldest(1) == ["c"]


def test_a_key_is_announced_once_deleted_if_any_of_its_deletes_asked_for_it() -> None:
    """A delete made for another process's announcement (announce=False) is not announced
    again; one of this process's own for the same key still is."""
    keys = UndeletedKeys()
    keys.add("peer", announce=False)
    keys.add("own")
    keys.add("both", announce=False)
    keys.add("both")
    keys.add("both", announce=False)
    assert keys.to_announce(keys.oldest(10)) == ["own", "both"]
