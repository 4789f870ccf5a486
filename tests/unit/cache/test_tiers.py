"""Every tier: round trip, expiry, delete, purge; memory: byte bound; redis: bad data, breaker."""

from __future__ import annotations

import asyncio
import logging
import time

import msgpack
import pytest
from redis.asyncio import Redis

from cache.codec import CacheEntry
from cache.errors import TierError
from cache.keys import KeyBuilder, Selector
from cache.metrics import CacheMetrics
from cache.tenant import TenantHasher, tenant_of
from cache.tiers.base import Tier
from cache.tiers.layered import LayeredTier
from cache.tiers.memory import MemoryTier
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings


def _entry(
    body: bytes = b'{"ok":1}', ttl: float = 60.0, events: list[bytes] | None = None
) -> CacheEntry:
    return CacheEntry(
        200,
        [("Content-Type", "application/json")],
        body=None if events else body,
        events=events,
        ttl=ttl,
        model="m",
        kind="chat",
    )


async def test_round_trip_body_and_events(tier: Tier) -> None:
    await tier.put("a.b.c.1", _entry())
    await tier.put("a.b.c.2", _entry(events=[b"data: {}", b"data: [DONE]"]))
    got = await tier.get("a.b.c.1")
    assert (
        got is not None
        and got.body == b'{"ok":1}'
        and got.headers == [("Content-Type", "application/json")]
    )
    got2 = await tier.get("a.b.c.2")
    assert got2 is not None and got2.events == [b"data: {}", b"data: [DONE]"]
    assert await tier.get("a.b.c.3") is None
    await tier.delete("a.b.c.1")
    assert await tier.get("a.b.c.1") is None


async def test_expiry_is_honoured(tier: Tier) -> None:
    await tier.put("a.b.c.1", _entry(ttl=1.0))
    assert await tier.get("a.b.c.1") is not None
    await asyncio.sleep(1.1)
    assert await tier.get("a.b.c.1") is None


async def test_purge_by_route_model_tenant_and_all(tier: Tier) -> None:
    f = {"x": 1}
    hasher = TenantHasher(b"k" * 32)
    chat, emb = KeyBuilder("chat", [], hasher), KeyBuilder("emb", [], hasher)
    keys = {
        "chat-m-alice": chat.build("m", f, {"Authorization": "alice"}),
        "chat-m-bob": chat.build("m", f, {"Authorization": "bob"}),
        "chat-m2-alice": chat.build("m2", f, {"Authorization": "alice"}),
        "emb-m-alice": emb.build("m", f, {"Authorization": "alice"}),
    }
    for k in keys.values():
        await tier.put(k.value, _entry())

    async def present() -> set[str]:
        return {n for n, k in keys.items() if await tier.get(k.value) is not None}

    assert (
        await tier.purge(Selector.of(tenant=tenant_of({"Authorization": "bob"}), hasher=hasher))
        >= 1
    )
    assert await present() == {"chat-m-alice", "chat-m2-alice", "emb-m-alice"}
    await tier.purge(Selector.of(model="m2"))
    assert await present() == {"chat-m-alice", "emb-m-alice"}
    await tier.purge(Selector.of(route="emb"))
    assert await present() == {"chat-m-alice"}
    await tier.purge(Selector())
    assert await present() == set()


async def test_memory_is_bounded_in_bytes_lru(metrics: CacheMetrics) -> None:
    mem = MemoryTier(4096, metrics)
    for i in range(10):
        mem.put_now(f"k{i}", _entry(body=b"x" * 900))
        mem.get_now("k0")  # k0 stays recently used
    assert mem.bytes <= 4096
    assert mem.get_now("k0") is not None
    assert mem.get_now("k1") is None
    assert not mem.put_now("huge", _entry(body=b"x" * 5000))  # larger than the whole tier


def _tampered(
    status: object = 200, headers: tuple[tuple[object, object], ...] = (("A", "b"),)
) -> bytes:
    """An entry's layout with one field set by hand, as a corrupt or tampered value would be."""
    fields = [1, status, [list(h) for h in headers], b"{}", None, time.time(), 60.0, "m", "", ""]
    packed: bytes = msgpack.packb(fields, use_bin_type=True)
    return packed


@pytest.mark.parametrize(
    "value",
    [
        b"\xc1not msgpack",
        _tampered(status=0),
        _tampered(status=600),
        _tampered(status=True),
        _tampered(headers=(("X-A\r\nInjected", "v"),)),
        _tampered(headers=(("X-A", "v\r\nSet-Cookie: a=b"),)),
        _tampered(headers=(("X-A", "v\x00"),)),
        _tampered(headers=(("X-A", 5),)),
    ],
    ids=[
        "garbage",
        "status-0",
        "status-600",
        "status-bool",
        "name-crlf",
        "value-crlf",
        "nul",
        "int",
    ],
)
async def test_undecodable_redis_entry_is_a_miss_deleted_and_counted(
    redis_server: RedisServer, metrics: CacheMetrics, value: bytes
) -> None:
    """Not msgpack, or an entry no upstream answer could have been (a status outside 100-599, a
    header with CR, LF or NUL that would split the replayed response): a miss, counted, gone."""
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    await tier.client.set(tier.prefix + "a.b.c.bad", value)
    assert await tier.get("a.b.c.bad") is None
    await asyncio.sleep(0.1)
    assert await tier.client.exists(tier.prefix + "a.b.c.bad") == 0
    assert metrics.decode_errors.labels("redis")._value.get() == 1
    await tier.aclose()


async def test_layered_promotes_l2_hits_into_l1(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    l1, l2 = MemoryTier(1 << 20, metrics), RedisTier(redis_settings(redis_server.url), metrics)
    tier = LayeredTier(l1, l2, metrics)
    await l2.put("a.b.c.1", _entry())
    assert l1.get_now("a.b.c.1") is None
    found = await tier.lookup("a.b.c.1")
    assert found is not None and found[1] == "redis"
    found = await tier.lookup("a.b.c.1")
    assert found is not None and found[1] == "memory"
    await l2.aclose()


async def test_dead_redis_opens_the_breaker_and_costs_nothing_then(metrics: CacheMetrics) -> None:
    dead = RedisServer().start()
    url = dead.url
    dead.stop()
    tier = RedisTier(redis_settings(url, breaker={"failures": 2, "open_s": 30}), metrics)
    for _ in range(2):
        assert await tier.get("a.b.c.1") is None
    assert tier.breaker.state == 1
    t0 = time.perf_counter()
    for _ in range(100):
        assert await tier.get("a.b.c.1") is None
        await tier.put("a.b.c.1", _entry())
    assert time.perf_counter() - t0 < 0.5  # skipped, not attempted
    assert metrics.breaker_state._value.get() == 1
    await tier.aclose()


async def test_concurrent_redis_gets_share_one_mget(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    for i in range(5):
        await tier.put(f"a.b.c.{i}", _entry(body=f"v{i}".encode()))

    async def mget_calls() -> int:
        stats = await tier.client.info("commandstats")
        return int(stats.get("cmdstat_mget", {}).get("calls", 0))

    before = await mget_calls()
    got = await asyncio.gather(*(tier.get(f"a.b.c.{i % 6}") for i in range(60)))
    assert await mget_calls() - before == 1
    for i, entry in enumerate(got):
        if i % 6 == 5:
            assert entry is None
        else:
            assert entry is not None and entry.body == f"v{i % 6}".encode()
    await tier.aclose()


async def test_outage_logs_once_not_per_request(
    metrics: CacheMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead Redis under many requests: one 'failing' line, every failure counted; its return:
    one 'recovered' line."""
    server = RedisServer().start()
    tier = RedisTier(redis_settings(server.url, breaker={"failures": 2, "open_s": 0.2}), metrics)
    caplog.set_level(logging.DEBUG, logger="latentgate.cache.redis")
    try:
        server.kill()
        for _ in range(5):  # several breaker cycles: open → half-open probe → open
            await asyncio.gather(*(tier.get(f"k{i}") for i in range(50)))
            await asyncio.sleep(0.25)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "failing" in warnings[0], warnings
        failures = sum(s.value for m in metrics.redis_errors.collect() for s in m.samples)
        assert failures >= 5  # one per probe at least, counted though not logged
        server.start()
        await asyncio.sleep(0.25)
        await tier.get("k0")
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2 and "recovered" in warnings[1], warnings
    finally:
        await tier.aclose()
        server.stop()


async def test_a_client_library_fault_is_an_outage_not_an_exception(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """Mid-failover redis-py raised AttributeError ('NoneType' object has no attribute
    'writelines') from a connection torn down under it; from the lease path it reached a client
    as a 500. Every tier operation must turn such a fault into a miss, counted like an outage."""
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    entry = _entry()
    assert await tier.acquire_lease("k.lease", 1000) is not None  # the real server answers

    async def torn_down(*args: object, **kwargs: object) -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    real_set, real_pttl = tier.client.set, tier.client.pttl
    tier.client.set = torn_down  # type: ignore[method-assign]
    tier.client.pttl = torn_down  # type: ignore[method-assign]
    try:
        assert await tier.acquire_lease("k.other", 1000) is not None  # unknown: it computes
        assert await tier.lease_held("k.other") is False
        await tier.put("k.entry", entry)  # no exception: the store is skipped and counted
        assert metrics.redis_errors.labels("lease", "AttributeError")._value.get() == 2
        assert metrics.redis_errors.labels("set", "AttributeError")._value.get() == 1
    finally:
        tier.client.set, tier.client.pttl = real_set, real_pttl  # type: ignore[method-assign]
    assert await tier.acquire_lease("k.after", 1000) is not None  # and it recovers
    await tier.aclose()


async def test_an_unreachable_redis_is_not_an_absent_key_when_checked(
    metrics: CacheMetrics,
) -> None:
    """`get` answers None either way; `get_checked` raises, so that the semantic index does not
    drop an entry (for every sidecar) because Redis did not answer one peek."""
    dead = RedisServer().start()
    url = dead.url
    dead.stop()
    l2 = RedisTier(redis_settings(url, breaker={"failures": 2, "open_s": 30}), metrics)
    layered = LayeredTier(MemoryTier(1 << 20, metrics), l2, metrics)
    for _ in range(3):  # before and after the breaker opens
        assert await layered.lookup("a.b.c.1") is None
        with pytest.raises(TierError):
            await layered.lookup("a.b.c.1", checked=True)
    await l2.aclose()


async def test_an_absent_key_is_none_when_checked(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    l2 = RedisTier(redis_settings(redis_server.url), metrics)
    layered = LayeredTier(MemoryTier(1 << 20, metrics), l2, metrics)
    assert await layered.lookup("a.b.c.absent", checked=True) is None
    await l2.put("a.b.c.2", _entry())
    found = await layered.lookup("a.b.c.2", checked=True)
    assert found is not None and found[1] == "redis"
    await l2.aclose()


async def test_a_lease_asked_while_redis_stalls_is_this_processs_not_a_stranger(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """A SET NX that times out can still land once Redis catches up (the command was sent). CI
    saw it under load: the gateway took the timeout for "another process holds the lease" and
    then waited the lease's 10 s for a peer that did not exist, while its own SET held the key.
    Now the process that could not tell computes, and its release deletes the lease if it did
    land (compare-and-delete on its own token), so no sidecar waits on it."""
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    sleeper = Redis.from_url(redis_server.url)  # no socket timeout: it sleeps the server
    try:
        assert await tier.lease_held("k.warm") is False  # the pool has a connection
        stall = asyncio.ensure_future(sleeper.execute_command("DEBUG", "SLEEP", "0.5"))
        await asyncio.sleep(0.05)
        token = await tier.acquire_lease("k.stalled", 10_000)
        assert token is not None  # unknown is not "held by another": this process computes
        await stall
        lock = tier.lock_prefix + "k.stalled"
        assert await sleeper.get(lock) == token.encode()  # the timed-out SET landed
        await tier.release_lease("k.stalled", token)
        assert await sleeper.exists(lock) == 0
        # and a definite answer still says so: the lease is another's, no token
        other = await tier.acquire_lease("k.held", 10_000)
        assert other is not None and await tier.acquire_lease("k.held", 10_000) is None
    finally:
        await tier.aclose()
        await sleeper.aclose()


async def test_a_lease_that_could_not_be_released_is_released_once_redis_answers(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """A release skipped while the breaker was open (Redis flapping) left the lease for its
    whole ttl: every other sidecar asking that key waited it out. It is tried again later."""
    tier = RedisTier(
        redis_settings(redis_server.url, breaker={"failures": 1, "open_s": 0.3}), metrics
    )
    probe = Redis.from_url(redis_server.url)
    try:
        token = await tier.acquire_lease("k.flap", 10_000)
        assert token
        lock = tier.lock_prefix + "k.flap"
        tier.breaker.failure()  # an outage opened it while the answer was computed
        await tier.release_lease("k.flap", token)
        assert await probe.exists(lock) == 1  # not sent
        for _ in range(60):
            if await probe.exists(lock) == 0:
                break
            await asyncio.sleep(0.05)
        assert await probe.exists(lock) == 0
    finally:
        await tier.aclose()
        await probe.aclose()


def test_the_memory_tier_remembers_what_each_purge_dropped() -> None:
    """An answer begun before a drop is kept out only when that drop matched its key; once the
    log no longer reaches back to when it began, any key counts as dropped (the safe answer)."""
    mem = MemoryTier(4096)
    began = mem.generation
    mem.dropped("a".__eq__)
    assert mem.dropped_since(began, "a") and not mem.dropped_since(began, "b")
    assert not mem.dropped_since(mem.generation, "a")  # begun after the drop
    for _ in range(2000):
        mem.dropped("c".__eq__)
    assert mem.dropped_since(began, "b")  # the log forgot whether "b" was dropped back then
    assert not mem.dropped_since(mem.generation - 1, "b")
    mem.clear()
    assert mem.dropped_since(mem.generation - 1, "b")


async def test_a_lease_key_without_an_expiry_is_no_peer_to_wait_for(
    redis_server: RedisServer, metrics: CacheMetrics
) -> None:
    """Every lease is taken with PX. A key there without an expiry (junk someone SET, a list, a
    PERSIST) was taken for a peer computing the answer: each miss of that key waited the
    lease's whole ttl (10 s by default), at each expiry of its entry, while the key stayed."""
    tier = RedisTier(redis_settings(redis_server.url), metrics)
    admin = Redis.from_url(redis_server.url)
    lock = tier.lock_prefix + "k.junk"
    try:
        await admin.set(lock, b"junk")
        assert await tier.acquire_lease("k.junk", 10_000) is None  # the SET NX finds it there
        assert await tier.lease_held("k.junk") is False
        await admin.delete(lock)
        await admin.rpush(lock, b"x")  # another type
        assert await tier.lease_held("k.junk") is False
        # a lease a process took is still one
        assert await tier.acquire_lease("k.taken", 10_000)
        assert await tier.lease_held("k.taken") is True
        assert await tier.lease_held("k.absent") is False
    finally:
        await tier.aclose()
        await admin.aclose()
