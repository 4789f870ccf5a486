"""The budget's shared counts through Redis faults: outages, lost replies, lost hashes, a
cluster failover and a rolling change of label_half_life (real Redis servers throughout)."""

from __future__ import annotations

import asyncio
import logging
import time as real_time
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from cache import redis_client
from cache.semantic import budget_store
from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.budget_store import BudgetStore
from cache.semantic.learn import RouteBudget
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from cache.settings import RedisSettings
from tests.semantic.test_budget_store import budget, in_redis
from tests.support.redis_topologies import RedisClusterServers
from tests.support.servers import RedisServer, free_port


class Clock:
    """The fleet's wall clock, moved by the test (an outage lasting minutes, a time of day)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def time(self) -> float:
        return real_time.time() + self.offset

    def monotonic(self) -> float:
        return real_time.monotonic() + self.offset


async def test_an_outage_holds_new_counts_as_one_batch(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """A batch per failed tick piled up (each flush re-sending all of them, and every id
    landing in the hash afterwards); one batch waits, new counts wait beside it."""
    b = budget(stage, verifier)
    r = aioredis.from_url(redis_server.url, socket_timeout=0.5)
    down = aioredis.from_url(f"redis://127.0.0.1:{free_port()}", socket_timeout=0.5)
    store = BudgetStore(down, {"chat": b}, f"op{uuid.uuid4().hex[:8]}:")
    try:
        assert b.on_count is not None
        for _ in range(200):
            b.on_count(0.97, 0.6, 0, 1, 1)
            assert not await store.flush()
        pending = store._routes["chat"].pending  # one batch waits; the rest wait beside it
        assert pending is not None and sum(pending[1].values()) == 2  # the first tick's
        assert sum(store._routes["chat"].new.values()) == 2 * 199
        store.redis = r
        for _ in range(3):  # the held batch, then what waited beside it; then its id goes
            assert await store.flush()
        raw = await r.hgetall(store.key("chat"))
        assert in_redis(raw, b"l") == 200 and b.grid.labels.sum() == 200
        assert not [k for k in raw if k.startswith(b"b:")]
    finally:
        await r.aclose()
        await down.aclose()


async def test_a_batch_held_through_a_long_outage_is_counted_once(
    redis_server: RedisServer,
    stage: SemanticStage,
    verifier: MlpVerifier,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch id aged from when the batch was made was already 'old' when first applied
    after a 20-minute outage: another process deleted it, and the resend counted twice."""
    clock = Clock()
    monkeypatch.setattr(budget_store, "time", clock)
    prefix = f"mk{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url, socket_timeout=0.5)
    down = aioredis.from_url(f"redis://127.0.0.1:{free_port()}", socket_timeout=0.5)
    other = aioredis.from_url(redis_server.url)
    a, b = budget(stage, verifier), budget(stage, verifier)
    sa = BudgetStore(r, {"chat": a}, prefix)
    sb = BudgetStore(other, {"chat": b}, prefix, idle_read=0)
    try:
        assert await sa.flush() and await sb.flush()
        assert a.on_count is not None
        a.on_count(0.97, 0.6, 1, 1, 0)  # one wrong label
        sa.redis = down  # unreachable for 20 minutes
        assert not await sa.flush()
        clock.offset += 1200
        sa.redis = r  # back, and the first send meets a stall: applied, its reply lost
        stall = asyncio.create_task(other.execute_command("DEBUG", "SLEEP", "1"))
        await asyncio.sleep(0.05)
        assert not await sa.flush()
        await stall
        await sb.flush()  # another process reads the hash meanwhile
        assert await sa.flush()  # sent again, under the same id
        raw = await other.hgetall(sa.key("chat"))
        assert in_redis(raw, b"w") == 1
    finally:
        await r.aclose()
        await down.aclose()
        await other.aclose()


async def test_after_a_lost_hash_no_process_loads_it_before_the_fleet_has_resent(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """Neither a process that counted nothing nor one that resent its own counts loads the
    hash while it holds only part of what the fleet knows."""
    prefix = f"lh{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)
    one, two, reader = budget(stage, verifier), budget(stage, verifier), budget(stage, verifier)
    stores = [BudgetStore(r, {"chat": x}, prefix, idle_read=0.3) for x in (one, two, reader)]
    try:
        for x, n in ((one, 120), (two, 80)):
            assert x.on_count is not None
            for _ in range(n):
                x.on_count(0.97, 0.6, 0, 1, 1)
        for s in stores * 2:
            await s.flush()
        assert reader.grid.labels.sum() == 200
        await r.delete(stores[0].key("chat"))  # Redis restarted without persistence
        await asyncio.sleep(0.35)  # every idle read comes round
        await stores[0].flush()  # sees the loss, sends its 120 again
        assert one.grid.labels.sum() == 200
        for _ in range(2):
            await stores[2].flush()
            assert reader.grid.labels.sum() == 200
        await stores[1].flush()  # the other counter sends its 80
        await asyncio.sleep(0.85)  # the hold (idle_read + interval) is over
        for s in stores:
            await s.flush()
        assert [x.grid.labels.sum() for x in (one, two, reader)] == [200, 200, 200]
    finally:
        await r.aclose()


async def test_a_shorter_half_life_does_not_delete_counts_made_a_moment_ago(
    redis_server: RedisServer,
    stage: SemanticStage,
    verifier: MlpVerifier,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rolling change of label_half_life from a day to an hour, at 17:00 UTC: five hours
    into the day's 6-hour epoch, the hour's process took fresh counts for 5 half-lives old."""
    day = 86400
    at = (int(real_time.time()) // day) * day + 17 * 3600 + 10
    monkeypatch.setattr(budget_store, "time", Clock(at - real_time.time()))

    def route(half_life: float) -> RouteBudget:
        grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3, half_life=half_life)
        return RouteBudget("chat", grid, ExactMatch(), stage, stage.metrics, 0.1, verifier)

    prefix = f"hm{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)
    old, new = route(86400.0), route(3600.0)
    so, sn = BudgetStore(r, {"chat": old}, prefix), BudgetStore(r, {"chat": new}, prefix)
    try:
        assert old.on_count is not None
        for _ in range(100):
            old.on_count(0.97, 0.6, 0, 1, 1)
        assert await so.flush() and await sn.flush()
        raw = await r.hgetall(so.key("chat"))
        assert in_redis(raw, b"l") == 100
        assert new.grid.labels.sum() == pytest.approx(100)  # fresh: they weigh whole
    finally:
        await r.aclose()


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


async def test_the_store_recovers_after_a_cluster_primary_fails_over(
    cluster: RedisClusterServers, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """A cluster pipeline kept dialling the dead primary, for every route; plain commands make
    the client re-read the slot map."""
    settings = RedisSettings.model_validate({"url": cluster.url, "mode": "cluster"})
    r = redis_client.connect(settings, socket_timeout=0.5, max_connections=4)  # as setup's own
    routes = {f"route{i}": budget(stage, verifier) for i in range(6)}
    store = BudgetStore(r, routes, f"fo{uuid.uuid4().hex[:8]}:")
    try:
        for b in routes.values():
            assert b.on_count is not None
            b.on_count(0.97, 0.6, 0, 1, 1)
        assert await store.flush()
        cluster.primary_of(store.key("route0")).kill()
        await asyncio.to_thread(cluster.wait_failover)
        for b in routes.values():
            assert b.on_count is not None
            b.on_count(0.97, 0.6, 0, 1, 1)
        # (the replica may not have had the route's hash yet: then the store sends it again
        # and holds its loads for idle_read, 5 s)
        deadline = real_time.monotonic() + 30.0
        while real_time.monotonic() < deadline:
            ok = await store.flush()
            if ok and [b.grid.labels.sum() for b in routes.values()] == [2] * 6:
                break
            await asyncio.sleep(0.5)
        assert ok
        assert [b.grid.labels.sum() for b in routes.values()] == [2] * 6
        for name in routes:
            assert in_redis(await r.hgetall(store.key(name)), b"l") == 2, name
    finally:
        await r.aclose()


async def test_an_outage_is_logged_once_not_once_a_flush(
    redis_server: RedisServer,
    stage: SemanticStage,
    verifier: MlpVerifier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flush is due every interval (0.5 s) while a batch waits: a Redis outage wrote a warning
    each time, two a second per process for as long as it lasted. One says it began, one that
    it ended; the failures are counted."""
    b = budget(stage, verifier)
    r = aioredis.from_url(redis_server.url, socket_timeout=0.5)
    down = aioredis.from_url(f"redis://127.0.0.1:{free_port()}", socket_timeout=0.5)
    store = BudgetStore(down, {"chat": b}, f"ol{uuid.uuid4().hex[:8]}:")
    caplog.set_level(logging.WARNING, logger="latentgate.semantic.budget")
    try:
        assert b.on_count is not None
        for _ in range(20):
            b.on_count(0.97, 0.6, 0, 1, 1)
            assert not await store.flush()
        lines = [r.getMessage() for r in caplog.records if r.name == "latentgate.semantic.budget"]
        assert len(lines) == 1 and "failing" in lines[0], lines
        assert b.metrics.sync.labels("budget", "error")._value.get() == 20
        store.redis = r
        assert await store.flush()
        lines = [r.getMessage() for r in caplog.records if r.name == "latentgate.semantic.budget"]
        assert len(lines) == 2 and "recovered after 20 failures" in lines[1], lines
    finally:
        await r.aclose()
        await down.aclose()
