"""A budget hash holding a field this version cannot read (a value that is not an integer: an
operator's HSET, a later version's counter) is skipped: before, it failed the store's start, so
the process never shared its labels nor read the fleet's, and then killed its flush loop."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from cache.semantic.budget_store import BudgetStore, field_name
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from tests.semantic.test_budget_store import budget, in_redis
from tests.support.servers import RedisServer


async def test_a_field_whose_value_is_not_a_count_is_skipped_and_the_rest_is_read(
    redis_server: RedisServer, stage: SemanticStage, verifier: MlpVerifier
) -> None:
    prefix = f"fo{uuid.uuid4().hex[:8]}:"
    r = aioredis.from_url(redis_server.url)
    b = budget(stage, verifier)
    store = BudgetStore(r, {"chat": b}, prefix)
    key = store.key("chat")
    good = field_name("l", 0, 0, 0.97, 0.6)
    await r.hset(key, mapping={good: 3, field_name("w", 0, 0, 0.97, 0.6): "1.5", "gen": "g0"})
    await r.hset(key, b"\xff\xfe", b"x")  # not even UTF-8
    try:
        await store.start()  # raised ValueError before
        assert b.grid.labels.sum() == 3  # the fleet's readable counts are loaded
        assert b.on_count is not None
        b.on_count(0.97, 0.6, 0, 1, 0)  # and this process's labels still go out
        assert await store.flush()
        assert (
            in_redis({k: v for k, v in (await r.hgetall(key)).items() if k == good.encode()}, b"l")
            == 4
        )
    finally:
        await store.aclose()
        await r.aclose()
