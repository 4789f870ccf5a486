"""cache.semantic.setup: labels the stage makes as soon as it serves reach the fleet.

The stage serves once the embedder is loaded; the Redis sync, the budget store and the tenant
label share start after that (the index replay can take seconds). Before, the store's and the
share's hooks were only installed once each had been built, after those starts: a label made
in between counted in this process's guard and grid, and reached no other process (nor the
stream a restarted process replays). Here Redis is stopped while the stage opens, so the
label is made with open() held in the sync's first read, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.semantic.setup import build_semantic
from gateway.config import Settings
from tests.semantic.test_gateway import semantic_config
from tests.semantic.test_learn import PAIRS, answer
from tests.semantic.test_route import chat
from tests.support.servers import RedisServer


async def test_a_label_made_while_the_stage_starts_its_redis_sharing_reaches_the_stream() -> None:
    redis = RedisServer().start()
    assert redis.proc is not None
    cfg = semantic_config("http://127.0.0.1:9", redis.url, max_error_rate=0.3, prior=False)
    # the stopped Redis holds open() in its first read until it resumes, not for an op deadline
    cfg["cache"]["redis"]["timeouts"] = {"op": 60}
    settings = Settings.model_validate(cfg)
    setup = build_semantic(settings.cache, CollectorRegistry(), settings.routes)
    assert setup is not None
    sr = setup.routes["chat"]
    budget = sr.budget
    assert budget is not None and budget.guard is not None
    raw = Redis.from_url(redis.url)
    redis.proc.send_signal(signal.SIGSTOP)
    opening = asyncio.ensure_future(setup.open())
    stopped = True
    try:
        while not setup.stage.ready:  # the embedder loads (seconds)
            assert not opening.done(), opening.exception()
            await asyncio.sleep(0.01)
        assert not opening.done()  # held in Redis
        q, para = PAIRS[0]
        await sr.remember(chat(q, temperature=0), "bad", "k-bad")
        res = await sr.search(chat(para, temperature=0), "bad")
        assert res.candidate is not None
        sr.label_after_miss(
            chat(para, temperature=0), "bad", res.candidate, answer(q), answer("no")
        )
        await budget.drain()
        assert budget.label_outcomes["miss", "disagree"] == 1  # counted here
        redis.proc.send_signal(signal.SIGCONT)
        stopped = False
        await opening
        share = setup._tenant_labels
        assert share is not None
        assert await share.flush()
        entries: Any = await raw.xrange(share.key("chat"))
        tenants = [t for _, f in entries for t, *_ in msgpack.unpackb(f[b"d"], raw=False)]
        assert tenants == ["bad"]  # the fleet (and a restart) hears of it
    finally:
        if stopped:
            redis.proc.send_signal(signal.SIGCONT)
        if not opening.done():
            await opening
        await setup.aclose()
        await raw.aclose()
        redis.stop()


async def test_a_starting_process_serves_no_budgeted_hit_before_it_has_heard_the_fleet() -> None:
    """A tenant refuted at A; B starts with Redis stalled: its stage is ready, but its budgeted
    route serves nobody (`joining_fleet`) until it has read the fleet's counts and labels, and
    then keeps that tenant apart. Before, B served at the bar its prior alone opened, to the
    refuted tenant too, until its replay ran (seconds: after the index replay)."""
    redis = RedisServer().start()
    assert redis.proc is not None
    # the shipped prior alone opens this route's bar: what a fresh process serves at
    cfg = semantic_config("http://127.0.0.1:9", redis.url, max_error_rate=0.2, min_labels=50)
    cfg["cache"]["redis"]["timeouts"] = {"op": 60}
    settings = Settings.model_validate(cfg)
    # A's bar stays shut (min_labels is no part of what a label means, so they share labels):
    # the bad tenant's paraphrases are misses there, each labelled by its answer
    strict = semantic_config("http://127.0.0.1:9", redis.url, max_error_rate=0.2)
    strict["cache"]["redis"] = cfg["cache"]["redis"]
    strict_settings = Settings.model_validate(strict)
    a = build_semantic(strict_settings.cache, CollectorRegistry(), strict_settings.routes)
    assert a is not None
    try:
        await a.open()
        sa = a.routes["chat"]
        assert sa.budget is not None
        q, para = PAIRS[0]
        await sa.remember(chat(q, temperature=0), "bad", "k-bad")
        for _ in range(3):
            res = await sa.search(chat(para, temperature=0), "bad")
            assert res.candidate is not None
            sa.label_after_miss(
                chat(para, temperature=0), "bad", res.candidate, answer(q), answer("no")
            )
            await sa.budget.drain()
        assert not sa.budget.bar("bad").open
        assert a._tenant_labels is not None and await a._tenant_labels.flush()
    finally:
        await a.aclose()
    b = build_semantic(settings.cache, CollectorRegistry(), settings.routes)
    assert b is not None
    budget = b.routes["chat"].budget
    assert budget is not None
    redis.proc.send_signal(signal.SIGSTOP)
    opening = asyncio.ensure_future(b.open())
    stopped = True
    try:
        while not b.stage.ready:
            assert not opening.done(), opening.exception()
            await asyncio.sleep(0.01)
        assert not opening.done()  # held in Redis
        for tenant in ("bad", "good"):
            bar = budget.bar(tenant)
            assert not bar.open and bar.reason == "joining_fleet", bar
        redis.proc.send_signal(signal.SIGCONT)
        stopped = False
        await opening
        assert budget.joined and not budget.bar("bad").open  # the fleet's verdict, replayed
    finally:
        if stopped:
            redis.proc.send_signal(signal.SIGCONT)
        if not opening.done():
            await opening
        await b.aclose()
        redis.stop()
