"""A full Redis (maxmemory reached, maxmemory-policy noeviction) refuses writes but answers
reads: a sidecar keeps reading the entries others stored there, says once in its log why its
own answers are not stored, and /readyz shows Redis reachable. Before, each refused write
counted as an outage: the breaker opened, that sidecar stopped reading Redis (a miss, and an
upstream call, for entries Redis held) and /readyz said Redis was unreachable."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.integration.cache.conftest import cache_config
from tests.ops.conftest import http
from tests.support.servers import RedisServer, ServerThread


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    server = RedisServer(["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.stop()


def _chat(url: str, content: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0}
    status, headers, raw = http(
        "POST",
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, raw
    assert json.loads(raw)["choices"][0]["message"]["content"] == f"echo(up): {content}"
    return headers["X-Cache"]


def test_a_full_redis_still_serves_what_it_holds(
    upstream: ServerThread,
    full_redis: RedisServer,
    start_gateway: Callable[..., ServerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = cache_config(upstream.url, full_redis.url)
    # an open breaker would stay open for the rest of the test: what it skips shows
    cfg["cache"]["redis"]["breaker"] = {"failures": 2, "open_s": 600}
    writer, reader = start_gateway(cfg), start_gateway(cfg)
    assert _chat(writer.url, "stored while Redis had room") == "miss"

    admin = redis.Redis.from_url(full_redis.url)
    admin.config_set("maxmemory", 1)  # every write is refused from now on, reads are not
    caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
    for i in range(5):  # misses whose lease and store Redis refuses
        assert _chat(reader.url, f"asked while Redis is full {i}") == "miss"
    # the reader finds the writer's entry in Redis
    assert _chat(reader.url, "stored while Redis had room") == "hit"

    ready = json.loads(http("GET", reader.url + "/readyz")[2])
    assert ready["redis"]["reachable"] is True and ready["redis"]["breaker"] == "closed"
    full = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(full) == 1, full  # once a spell, not once a request
    assert "answers are not stored there, reads go on" in full[0]

    admin.config_set("maxmemory", 0)  # room again: stores resume
    assert _chat(reader.url, "asked once Redis has room") == "miss"
    assert _chat(writer.url, "asked once Redis has room") == "hit"
    admin.close()


def test_a_read_only_replica_still_serves_what_it_holds_and_says_why_it_stores_nothing(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A standalone gateway left talking to a primary that a failover demoted: its reads answer,
    its writes fail READONLY. Each miss's get succeeded between its failed lease and store, so
    the breaker never opened and nothing was logged: answers silently stopped being stored (or,
    with a breaker that opens after two, the reads of what the replica holds stopped too)."""
    primary, demoted = RedisServer().start(), RedisServer().start()
    try:
        cfg = cache_config(upstream.url, primary.url)
        cfg["cache"]["redis"]["breaker"] = {"failures": 2, "open_s": 600}
        writer = start_gateway(cfg)
        assert _chat(writer.url, "stored on the primary") == "miss"
        replica = redis.Redis.from_url(demoted.url)
        replica.replicaof("127.0.0.1", primary.port)
        for _ in range(200):  # the full sync: the replica holds the primary's entry
            if replica.info("replication").get("master_link_status") == "up" and replica.dbsize():
                break
            time.sleep(0.05)
        assert replica.dbsize() == 1
        replica.close()
        cfg["cache"]["redis"]["url"] = demoted.url
        reader = start_gateway(cfg)
        caplog.set_level(logging.WARNING, logger="latentgate.cache.redis")
        for i in range(5):  # misses whose lease and store the replica refuses
            assert _chat(reader.url, f"asked of a replica {i}") == "miss"
        assert _chat(reader.url, "stored on the primary") == "hit"  # read from the replica

        ready = json.loads(http("GET", reader.url + "/readyz")[2])
        assert ready["redis"]["reachable"] is True and ready["redis"]["breaker"] == "closed"
        lines = [r.getMessage() for r in caplog.records if "read-only replica" in r.getMessage()]
        assert len(lines) == 1, lines  # once a spell, not once a request
        assert "point cache.redis.url at the primary" in lines[0]
    finally:
        primary.stop()
        demoted.stop()
