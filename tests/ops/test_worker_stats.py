"""/admin/cache/stats with `--workers 2`: the gateway's figures, whichever worker answers.

Before: the worker the call landed on answered with its own counters, so the lookups and hits
were one worker's share and changed from call to call as calls landed on one or the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.worker_stats import merge
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.ops.conftest import http_json
from tests.support.servers import GatewayProcess, ServerThread

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_stats_are_every_workers_summed(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    gw = gateway_process(cache_config(upstream.url, tiers=["memory"]), workers=2)
    sent = 0
    for i in range(12):
        chat = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0}
        for _ in range(2):  # a miss, then (on whichever worker) a hit or a miss
            assert http_json("POST", gw.url + "/v1/chat/completions", chat)[0] == 200
            sent += 1
    answers = [http_json("GET", gw.url + "/admin/cache/stats", headers=AUTH) for _ in range(8)]
    for status, stats in answers:
        assert status == 200, stats
        assert stats["workers_missing"] == 0 and set(stats["workers"]) == {"0", "1"}
        per_worker = [w["lookups"] for w in stats["workers"].values()]
        assert stats["lookups"] == sum(per_worker) == sent  # before: one worker's share
        assert stats["hits"] + stats["misses"] == sent
        memory = stats["tiers"]["memory"]
        assert memory["entries"] == sum(
            w["tiers"]["memory"]["entries"] for w in stats["workers"].values()
        )
    assert len({(s["lookups"], s["hits"]) for _, s in answers}) == 1  # the same, every call
    # the port spread the calls over both workers (else the sums prove nothing)
    assert all(w["lookups"] > 0 for w in answers[0][1]["workers"].values())


def test_each_workers_redis_breakers_are_shown() -> None:
    """Each worker has its own Redis breakers (the write breaker too: a write stall opens it in
    the workers that wrote): the sum shows every worker's, not the first one's as everyone's."""

    def worker(writes: str) -> dict[str, Any]:
        redis = {"breaker": "closed", "writes": writes, "entries": 3, "hits": 0}
        return {"lookups": 1, "tiers": {"memory": {"entries": 1, "hits": 0}, "redis": redis}}

    redis = merge({0: worker("closed"), 1: worker("open")}, 2)["tiers"]["redis"]
    assert redis["writes"] == {"0": "closed", "1": "open"}
    assert redis["breaker"] == {"0": "closed", "1": "closed"} and redis["entries"] == 3
