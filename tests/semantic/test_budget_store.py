"""The budget's shared counts on a real Redis: what each flush sends."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.budget_store import BudgetStore
from cache.semantic.learn import RouteBudget
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
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
