"""A full Redis (maxmemory reached, maxmemory-policy noeviction) refuses writes but answers
reads: a sidecar keeps reading the entries others stored there, says once in its log why its
own answers are not stored, and /readyz shows Redis reachable. Before, each refused write
counted as an outage: the breaker opened, that sidecar stopped reading Redis (a miss, and an
upstream call, for entries Redis held) and /readyz said Redis was unreachable."""

from __future__ import annotations

import json
import logging
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
