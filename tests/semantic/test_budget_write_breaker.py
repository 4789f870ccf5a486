"""The budget store and the tenant labels write to Redis only while the exact tier's write
breaker lets writes go (cache.tiers.redis_writes), and their verdicts count there: while it is
open nothing of theirs reaches Redis, the counts and labels wait, and once it closes each goes
exactly once. Before, both sent a round trip every 0.5 s to a Redis known to stall writes, each
on a new connection that waited out the socket timeout. Observed with Redis's own counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.breaker import CLOSED, OPEN
from cache.metrics import CacheMetrics
from cache.redis_client import AnyRedis, connect
from cache.semantic.budget_store import BudgetStore
from cache.semantic.learn import RouteBudget
from cache.semantic.stage import SemanticStage
from cache.semantic.tenant_labels import TenantLabelShare
from cache.semantic.verifier import MlpVerifier
from cache.tiers.redis import RedisTier
from tests.semantic.test_budget_store import in_redis
from tests.semantic.test_tenant_labels import _budget, _refuted, _route
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings
from tests.unit.cache.test_tiers import _entry

WRITES = ("eval", "evalsha", "xadd", "expire", "hdel", "hset", "hincrby")


@dataclass
class Process:
    """One gateway's sharing: its exact tier (whose write breaker gates), its budget, its
    budget store and tenant labels on the semantic client."""

    tier: RedisTier
    client: AnyRedis
    budget: RouteBudget
    store: BudgetStore
    share: TenantLabelShare


@pytest.fixture
async def gateway(
    own_redis: tuple[RedisServer, Redis], stage: SemanticStage, verifier: MlpVerifier
) -> AsyncIterator[Process]:
    server, _ = own_redis
    settings = redis_settings(server.url, breaker={"failures": 2, "open_s": 600})
    tier = RedisTier(settings, CacheMetrics(CollectorRegistry()))
    client = connect(settings, socket_timeout=0.5, max_connections=4)
    budget = _budget(_route(stage, verifier))
    store = BudgetStore(client, {"chat": budget}, settings.key_prefix, interval=3600)
    share = TenantLabelShare(client, {"chat": budget}, settings.key_prefix, interval=3600)
    store.writes = share.writes = tier.writes
    await store.start()
    await share.start()
    yield Process(tier, client, budget, store, share)
    await store.aclose()
    await share.aclose()
    await client.aclose()
    await tier.aclose()


async def _commands(admin: Redis, names: tuple[str, ...]) -> int:
    stats = await admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names)


async def _stall_writes(admin: Redis, tier: RedisTier) -> None:
    """A real write stall opens the write breaker, then ends: whatever is sent from here on
    lands, and Redis counts it."""
    await admin.client_pause(600_000, all=False)  # WRITE
    for _ in range(2):
        await tier.put("k", _entry())  # times out
    assert tier.writes.state == OPEN
    await admin.client_unpause()


def _events(p: Process, outcome: str, direction: str = "budget") -> float:
    value: float = p.budget.metrics.sync.labels(direction, outcome)._value.get()
    return value


async def test_counts_and_labels_wait_while_writes_are_held_and_go_once_after(
    own_redis: tuple[RedisServer, Redis],
    gateway: Process,
    stage: SemanticStage,
    verifier: MlpVerifier,
) -> None:
    server, admin = own_redis
    p = gateway
    await _stall_writes(admin, p.tier)
    before = await _commands(admin, (*WRITES, "hgetall", "xrange"))
    assert p.budget.on_count is not None and p.budget.on_tenant_label is not None
    for _ in range(6):  # wrong hits for one tenant, counted in this process
        p.budget.on_count(0.97, 0.6, 1, 1, 1)
        p.budget.on_tenant_label("bad-tenant", 0.97, 0.6, False)
    for _ in range(3):  # ticks while the breaker is open
        assert not await p.store.flush()
        assert not await p.share.flush()
    assert await _commands(admin, (*WRITES, "hgetall", "xrange")) == before  # before: 6 sent
    assert await admin.exists(p.store.key("chat"), p.share.key("chat")) == 0
    assert _events(p, "held") == 1 and _events(p, "held", "tenant_labels") == 1

    p.tier.writes.breaker.open_s = 0  # (its 600 s pass): the next write is the probe
    assert await p.store.flush()  # the probe: writes resume
    assert p.tier.writes.state == CLOSED
    assert await p.share.flush() and await p.store.flush() and await p.share.flush()
    assert in_redis(await admin.hgetall(p.store.key("chat")), b"w") == 6  # each once

    # another process hears the six wrong labels once: the tenant is refuted there too
    other = _route(stage, verifier)
    reader = TenantLabelShare(
        connect(redis_settings(server.url), socket_timeout=0.5, max_connections=2),
        {"chat": _budget(other)},
        p.share.prefix,
        interval=3600,
    )
    await reader.start()
    try:
        assert _refuted(other, "bad-tenant")
        entries = await admin.xrange(p.share.key("chat"))
        assert len(entries) == 1  # one batch, sent once
    finally:
        await reader.aclose()
        await reader.redis.aclose()


async def test_a_stalled_flush_counts_in_the_write_breaker_which_then_holds_the_rest(
    own_redis: tuple[RedisServer, Redis], gateway: Process
) -> None:
    """Writes stall and nothing else writes: the budget store's own timeouts open the write
    breaker (two in a row), after which its ticks send nothing to the stalled Redis. Before,
    every tick waited out the socket timeout on a new connection, and the breaker stayed
    closed."""
    _, admin = own_redis
    p = gateway
    assert p.budget.on_count is not None
    p.budget.on_count(0.97, 0.6, 0, 1, 1)
    connected = int((await admin.info("stats"))["total_connections_received"])
    await admin.client_pause(600_000, all=False)  # WRITE
    for _ in range(5):
        assert not await p.store.flush()
    await admin.client_unpause()
    assert p.tier.writes.state == OPEN
    assert _events(p, "error") == 2 and _events(p, "held") == 1
    assert int((await admin.info("stats"))["total_connections_received"]) - connected <= 2

    p.tier.writes.breaker.open_s = 0
    assert await p.store.flush() and await p.store.flush()
    assert in_redis(await admin.hgetall(p.store.key("chat")), b"l") == 1  # kept, sent once
