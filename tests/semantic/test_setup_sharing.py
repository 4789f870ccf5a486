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
