"""An unsafe request's invalidation (RFC 9111 4.4) taken while this process has Redis marked
down (its breaker open: a busy process's stalled reads open it while Redis itself is fine).

Before: the delete and the announcement were both skipped, so the entry stayed in Redis, and
every other sidecar kept serving the old answer from its memory for the entry's whole TTL.
Now the delete is remembered and sent, and announced, once Redis answers
(cache.tiers.undeleted).
"""

from __future__ import annotations

import re
import signal
import urllib.request
import uuid
from collections.abc import Callable

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import (
    memory_entries,
    request,
    until,
    upstream_calls,
)
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

OPEN = re.compile(r"^latentgate_cache_redis_breaker_state (\S+)$", re.M)


def _breaker(gw: GatewayProcess) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as r:
        found = OPEN.search(r.read().decode())
    assert found is not None
    return float(found.group(1))


def test_an_invalidation_taken_while_redis_is_marked_down_reaches_redis_and_the_others(
    upstream: ServerThread, processes: Callable[..., GatewayProcess]
) -> None:
    redis = RedisServer().start()
    assert redis.proc is not None
    try:
        cfg = cache_config(upstream.url, redis.url, routes=("default",))
        # one failure opens A's breaker, and it stays open long enough for the DELETE to be
        # taken inside it however slow the machine (the entries live 60 s)
        cfg["cache"]["redis"]["breaker"] = {"failures": 1, "open_s": 8}
        a, b = processes(cfg), processes(cfg)
        path = f"/items/{uuid.uuid4().hex[:8]}"
        assert request(a.url + path)[1]["X-Cache"] == "miss"
        assert request(b.url + path)[1]["X-Cache"] == "hit"  # from Redis, now in B's memory

        redis.proc.send_signal(signal.SIGSTOP)
        try:  # A's read of another target times out: A marks Redis down
            assert request(a.url + f"/items/{uuid.uuid4().hex[:8]}")[0] == 200
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert _breaker(a) == 1.0

        status, headers, _ = request(a.url + path, "DELETE")
        assert (status, headers["X-Cache"]) == (200, "bypass")
        until(lambda: memory_entries(b) == 0, "B's memory still holds the deleted target")
        calls = upstream_calls(upstream, path)
        assert request(b.url + path)[1]["X-Cache"] == "miss"  # not in Redis either
        assert upstream_calls(upstream, path) > calls
    finally:
        if redis.proc.poll() is None:
            redis.proc.send_signal(signal.SIGCONT)
        redis.stop()
