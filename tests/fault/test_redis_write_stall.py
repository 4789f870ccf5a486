"""A Redis that stalls writes and answers reads (`CLIENT PAUSE ... WRITE`, a primary blocked on
its disk or replicas): after a few writes in a row time out the gateway sends no more for a
while (the write breaker, cache/tiers/redis_writes.py), says so once in its log, in /metrics and
in /readyz, keeps reading, and stores again once a write goes through. Before, each miss's read
reset the breaker between its lease, store and release, which all timed out: the breaker never
opened, nothing was logged, and every miss paid three op timeouts (~0.3 s) for the whole stall."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
import redis

from gateway.state import STATE
from tests.fault.test_redis_full import _chat
from tests.integration.cache.conftest import cache_config
from tests.ops.conftest import http
from tests.support.servers import RedisServer, ServerThread

OPENED = "write breaker open"


@pytest.fixture
def paused_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()  # its own: a pause would stall every test on a shared one
    yield server
    server.stop()


def _metrics(url: str) -> dict[str, float]:
    """The gateway's samples, by their full name with labels."""
    text = http("GET", url + "/metrics")[2].decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _write_timeouts(url: str) -> float:
    """Writes sent that timed out: during the stall, each write sent is one."""
    m = _metrics(url)
    return sum(
        v
        for k, v in m.items()
        if k.startswith("latentgate_cache_redis_errors_total{")
        and 'kind="timeout"' in k
        and any(f'op="{op}"' in k for op in ("lease", "set", "delete"))
    )


def test_a_write_stall_stops_the_writes_then_they_resume(
    upstream: ServerThread,
    paused_redis: RedisServer,
    start_gateway: Callable[..., ServerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = cache_config(upstream.url, paused_redis.url)
    # the default 5 failures; open long enough that no probe goes out during the stall
    # (shortened below once it is over)
    cfg["cache"]["redis"]["breaker"] = {"failures": 5, "open_s": 600}
    gw, reader = start_gateway(cfg), start_gateway(cfg)
    assert _chat(gw.url, "stored before the stall") == "miss"

    admin = redis.Redis.from_url(paused_redis.url)
    caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
    admin.client_pause(600_000, all=False)  # WRITE: reads are served, writes wait
    try:
        # the first miss's lease, store and release time out, then the second's lease and store:
        # five writes in a row (its read answered in between)
        for i in range(2):
            assert _chat(gw.url, f"asked during the stall {i}") == "miss"
        sent = _write_timeouts(gw.url)
        assert sent > 0
        for i in range(2, 7):  # answered, and no write is sent for them
            assert _chat(gw.url, f"asked during the stall {i}") == "miss"
        assert _write_timeouts(gw.url) == sent  # before: 3 more for each miss
        m = _metrics(gw.url)
        assert m["latentgate_cache_redis_write_breaker_state"] == 1  # writes off
        assert m["latentgate_cache_redis_breaker_state"] == 0  # reads on
        # reads go on: another sidecar finds the entry stored before the stall
        assert _chat(reader.url, "stored before the stall") == "hit"

        ready = json.loads(http("GET", gw.url + "/readyz")[2])["redis"]
        assert ready["reachable"] is True and ready["breaker"] == "closed", ready
        assert ready["writes"] == "open" and "timed out" in ready["writes_error"], ready
        opened = [r.getMessage() for r in caplog.records if OPENED in r.getMessage()]
        assert len(opened) == 1, opened  # once a stall, not once a miss
    finally:
        admin.client_unpause()

    # the write breaker's open_s elapses (600 s above): the next write is its probe
    cache = gw.app[STATE].cache
    assert cache is not None and cache.redis is not None
    cache.redis.writes.breaker.open_s = 0
    assert _chat(gw.url, "asked once the stall is over") == "miss"
    assert _metrics(gw.url)["latentgate_cache_redis_write_breaker_state"] == 0
    # stored in Redis again: the other sidecar, which never asked it, finds it there
    assert _chat(reader.url, "asked once the stall is over") == "hit"
    recovered = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recovered) == 1 and "writes" in recovered[0], recovered
    admin.close()
