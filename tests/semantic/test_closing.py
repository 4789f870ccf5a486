"""The semantic stage's Redis loops end when closed at any moment, including right after they
start, while their first Redis exchange is in flight (a gateway reloaded or stopped as it
starts): each close used to be one cancel, which redis-py can spend on a command in flight."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis

from cache.embedder import Embedder
from cache.semantic.budget_store import BudgetStore
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.semantic.verifier import MlpVerifier
from cache.settings import RedisSettings
from tests.semantic.test_budget_store import budget
from tests.semantic.test_sync import new_stage
from tests.support.servers import RedisServer


async def test_a_budget_store_closed_while_it_flushes_ends(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    r = aioredis.from_url(redis_server.url)
    try:
        for i in range(20):
            store = BudgetStore(r, {"chat": budget(stage, verifier)}, f"c{uuid.uuid4().hex[:8]}:")
            store.interval = 0.0  # its loop is always in a flush, or about to be
            await store.start()
            for _ in range(i % 4):
                await asyncio.sleep(0)
            await asyncio.wait_for(store.aclose(), 10)
    finally:
        await r.aclose()


async def test_a_sync_closed_as_it_starts_ends(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    settings = RedisSettings(url=redis_server.url, key_prefix=f"c{uuid.uuid4().hex[:8]}:")
    for i in range(10):
        sync = RedisSync.from_settings(new_stage(embedder), settings, block_ms=100)
        await sync.start()
        for _ in range(i % 3):
            await asyncio.sleep(0)
        await asyncio.wait_for(sync.aclose(), 10)
