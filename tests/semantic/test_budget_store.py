"""The budget's shared counts on a real Redis: what each flush sends."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from cache.redis_client import connect
from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.budget_store import BudgetStore, _arrays
from cache.semantic.learn import RouteBudget
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from cache.settings import RedisSettings
from tests.support.redis_topologies import RedisClusterServers
from tests.support.servers import RedisServer


def budget(stage: SemanticStage, verifier: MlpVerifier) -> RouteBudget:
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3)
    return RouteBudget("chat", grid, ExactMatch(), stage, stage.metrics, 0.1, scorer=verifier)


async def hgetalls(r: aioredis.Redis) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_an_idle_process_reads_the_fleet_counts_seldom_and_a_busy_one_at_once(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)
    busy, idle = budget(stage, verifier), budget(stage, verifier)
    a = BudgetStore(r, {"chat": busy}, prefix, idle_read=3600)
    b = BudgetStore(r, {"chat": idle}, prefix, idle_read=3600)
    try:
        await a.flush()
        await b.flush()  # each reads once when it starts
        before = await hgetalls(r)
        for _ in range(5):
            await b.flush()  # nothing new here: no read until idle_read has passed
        assert await hgetalls(r) == before
        assert busy.on_count is not None
        busy.on_count(0.97, 0.6, 0, 1, 1)  # one label (right) and one lookup, counted here
        await a.flush()  # new counts: sent, and the totals read back at once
        assert await hgetalls(r) == before + 1
        assert busy.grid.labels.sum() == 1
        b.idle_read = 0.0  # its idle period over: the idle one reads the fleet's counts
        await b.flush()
        assert idle.grid.labels.sum() == 1 and idle.grid.volume.sum() == 1
    finally:
        await r.aclose()


def in_redis(raw: dict[bytes, bytes], kind: bytes) -> int:
    return sum(int(v) for k, v in raw.items() if k.startswith(kind + b":"))


async def test_a_flush_whose_reply_was_lost_is_not_counted_twice(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """Redis stalls (a fork, a failover's CLIENT PAUSE, a slow command): the client gives up on
    a flush the server still runs, and sends the same counts again."""
    prefix = f"dc{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url, socket_timeout=0.5)  # as the sync's client
    other = aioredis.from_url(redis_server.url)
    b = budget(stage, verifier)
    store = BudgetStore(r, {"chat": b}, prefix)
    try:
        assert await store.flush()
        assert b.on_count is not None
        b.on_count(0.97, 0.6, 1, 1, 0)  # one wrong label
        stall = asyncio.create_task(other.execute_command("DEBUG", "SLEEP", "1"))
        await asyncio.sleep(0.05)
        assert not await store.flush()  # the client timed out...
        await stall
        raw = await other.hgetall(store.key("chat"))
        assert in_redis(raw, b"l") == 1  # ... after the server had run it
        assert await store.flush()  # sent again
        raw = await other.hgetall(store.key("chat"))
        assert (in_redis(raw, b"l"), in_redis(raw, b"w")) == (1, 1)
        assert (b.grid.labels.sum(), b.grid.wrong.sum()) == (1, 1)
        assert await store.flush()  # the batch's id goes with the next flush, once acked
        raw = await other.hgetall(store.key("chat"))
        assert not [k for k in raw if k.startswith(b"b:")]
    finally:
        await r.aclose()
        await other.aclose()


async def test_a_long_stall_under_the_flush_loop_counts_one_label_once(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    prefix = f"dc{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url, socket_timeout=0.5)
    other = aioredis.from_url(redis_server.url)
    b = budget(stage, verifier)
    store = BudgetStore(r, {"chat": b}, prefix)
    try:
        await store.start()
        assert b.on_count is not None
        b.on_count(0.97, 0.6, 1, 1, 0)
        await other.execute_command("DEBUG", "SLEEP", "3")  # every flush meanwhile times out
        await asyncio.sleep(2.0)
        raw = await other.hgetall(store.key("chat"))
        assert in_redis(raw, b"w") == 1
    finally:
        await store.aclose()
        await r.aclose()
        await other.aclose()


async def test_a_lost_hash_gets_every_process_counts_back_once(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """Redis comes back empty (no persistence; a failover to a replica that had not synced):
    the processes that counted send their counts again, each once, and no bar is lost."""
    prefix = f"rr{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)
    one, two, reader = budget(stage, verifier), budget(stage, verifier), budget(stage, verifier)
    stores = [BudgetStore(r, {"chat": x}, prefix, idle_read=0.0) for x in (one, two, reader)]
    try:
        for x, n in ((one, 120), (two, 80)):
            assert x.on_count is not None
            for _ in range(n):
                x.on_count(0.97, 0.6, 0, 1, 1)
        for s in stores:
            await s.flush()
        assert reader.grid.labels.sum() == 200 and reader.bar().open
        await r.delete(stores[0].key("chat"))
        for _ in range(2):  # a process that counted nothing does not load the empty hash
            await stores[2].flush()
            assert reader.grid.labels.sum() == 200 and reader.bar().open
        assert one.on_count is not None
        one.on_count(0.97, 0.6, 0, 1, 1)  # one more label, after the loss
        for s in stores:  # the counters send theirs again
            await s.flush()
        await asyncio.sleep(0.55)  # no process loads before every one has read (the hold)
        for s in stores:
            await s.flush()
        raw = await r.hgetall(stores[0].key("chat"))
        assert in_redis(raw, b"l") == 201
        for x in (one, two, reader):
            assert x.grid.labels.sum() == 201 and x.bar().open
    finally:
        await r.aclose()


async def test_a_changed_half_life_ages_old_counts_by_their_real_age(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """Counts written under a one-hour half-life, read under a one-day one: ten days on they
    weigh nothing and leave the hash (they were once read as from the future, weighing 1)."""
    prefix = f"hl{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)

    def route(half_life: float) -> RouteBudget:
        grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3, half_life=half_life)
        return RouteBudget("chat", grid, ExactMatch(), stage, stage.metrics, 0.1, verifier)

    try:
        hour, day = route(3600.0), route(86400.0)
        old = BudgetStore(r, {"chat": hour}, prefix)
        assert hour.on_count is not None
        for _ in range(20):
            hour.on_count(0.97, 0.6, 1, 1, 0)
        await old.flush()
        new = BudgetStore(r, {"chat": day}, prefix)
        await new.flush()
        assert day.grid.labels.sum() == pytest.approx(20, rel=0.05)  # written just now
        got = await r.hgetall(new.key("chat"))
        raw = {k.decode(): int(v) for k, v in got.items() if k != b"gen"}
        (labels, wrong, _), stale = _arrays(day.grid, raw, time.time() + 10 * 86400)
        assert labels.sum() < 0.01 and wrong.sum() < 0.01
        assert {f for f in raw if f[0] in "lw"} <= set(stale)
    finally:
        await r.aclose()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


async def test_batches_go_to_each_route_slot_on_a_redis_cluster(
    cluster: RedisClusterServers, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """The batch script names one key, so a cluster pipeline sends each route's to its slot;
    a batch sent again is still counted once there."""
    settings = RedisSettings.model_validate({"url": cluster.url, "mode": "cluster"})
    r = connect(settings, socket_timeout=2.0, max_connections=8)
    prefix = f"cl{uuid.uuid4().hex[:8]}:"
    routes = {f"route{i}": budget(stage, verifier) for i in range(6)}
    store = BudgetStore(r, routes, prefix)
    try:
        for b in routes.values():
            assert b.on_count is not None
            b.on_count(0.97, 0.6, 1, 2, 0)
        assert await store.flush()
        slots = {r.keyslot(store.key(name)) for name in routes}
        assert len(slots) > 1  # the keys do live in several slots
        # one route's batch as if its reply had been lost: not acknowledged, sent again
        st = store._routes["route0"]
        st.pending = (st.acked.pop(), Counter(st.sent))
        assert await store.flush()
        for name, b in routes.items():
            raw = await r.hgetall(store.key(name))
            assert (in_redis(raw, b"l"), in_redis(raw, b"w")) == (2, 1), name
            assert b.grid.labels.sum() == 2
    finally:
        await r.aclose()


def test_batch_ids_are_dropped_only_when_no_resend_can_follow(verifier: MlpVerifier) -> None:
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, half_life=3600.0)
    now = time.time()
    fresh, old = "b:a1", "b:b2"  # valued when they were applied
    counts = {fresh: int(now) - 60, old: int(now) - 3600, "l:x:0:0.97:0.6": 5}
    (labels, _, _), stale = _arrays(grid, counts, now)
    assert stale == [old, "l:x:0:0.97:0.6"] and labels.sum() == 0


async def test_the_longest_half_life_config_allows_is_shared_and_read_back(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """label_half_life's ceiling (ten years) still makes whole-second epochs and an expiry
    Redis takes: a label sent by one process is read by another."""
    from cache.settings import MAX_HALF_LIFE_S

    prefix = f"hl{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)

    def route() -> RouteBudget:
        grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, half_life=MAX_HALF_LIFE_S)
        return RouteBudget("chat", grid, ExactMatch(), stage, stage.metrics, 0.1, verifier)

    a, b = route(), route()
    sa, sb = BudgetStore(r, {"chat": a}, prefix), BudgetStore(r, {"chat": b}, prefix)
    try:
        assert a.on_count is not None
        a.on_count(0.97, 0.6, 1, 1, 0)  # one wrong label
        assert await sa.flush() and await sb.flush()
        assert (b.grid.labels.sum(), b.grid.wrong.sum()) == (1, 1)
        assert await r.ttl(sa.key("chat")) > 0
    finally:
        await r.aclose()
