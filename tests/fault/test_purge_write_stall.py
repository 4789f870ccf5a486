"""An operator's purge while Redis stalls writes (`CLIENT PAUSE ... WRITE`) and the write breaker
has opened: the answer is a 202 naming what waits, and nothing is sent to the stalled Redis for
it. Before, the purge sent its UNLINKs and then its announcement (an XADD) to the stalled Redis
and waited for each to time out (the op timeout, then the fan-out client's socket timeout,
1.75 s by default), at every purge, for as long as the stall lasted; its answer was a 202 that
named no part as pending."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis

from gateway.state import STATE
from tests.fault.test_redis_full import _chat
from tests.fault.test_redis_write_stall import _metrics
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.integration.cache.fleet import until
from tests.ops.conftest import http_json
from tests.support.servers import RedisServer, ServerThread

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def paused_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()  # its own: a pause would stall every test on a shared one
    yield server
    server.stop()


def _sent_and_failed(url: str) -> float:
    """Purge writes and purge announcements sent that failed (a skipped one was not sent)."""
    return sum(
        v
        for k, v in _metrics(url).items()
        if k.startswith("latentgate_cache_redis_errors_total{")
        and ('op="purge"' in k or 'op="purge_fanout"' in k)
        and 'kind="skipped"' not in k
    )


def test_a_purge_during_a_write_stall_answers_what_waits_and_sends_nothing(
    upstream: ServerThread,
    paused_redis: RedisServer,
    start_gateway: Callable[..., ServerThread],
) -> None:
    cfg = cache_config(upstream.url, paused_redis.url)
    cfg["cache"]["redis"]["breaker"] = {"failures": 1, "open_s": 600}
    gw, peer = start_gateway(cfg), start_gateway(cfg)
    assert _chat(gw.url, "purged during the stall") == "miss"
    assert _chat(peer.url, "purged during the stall") == "hit"  # from Redis, now in its memory
    admin = redis.Redis.from_url(paused_redis.url)
    admin.client_pause(600_000, all=False)  # WRITE: reads are served, writes wait
    try:
        assert _chat(gw.url, "opens the write breaker") == "miss"  # its lease times out
        assert _metrics(gw.url)["latentgate_cache_redis_write_breaker_state"] == 1
        failed = _sent_and_failed(gw.url)

        status, body = http_json("POST", gw.url + "/admin/cache/purge", {"all": True}, AUTH)
        assert status == 202, body
        assert _sent_and_failed(gw.url) == failed  # before: its UNLINK and XADD timed out
        assert body["pending"] == ["redis", "other_processes"], json.dumps(body)
        assert body["purged"]["redis"]["retrying"] is True
        assert body["purged"]["other_processes"].startswith("not announced"), body
        # the purged answer is not read back from Redis meanwhile
        assert _chat(gw.url, "purged during the stall") == "miss"
    finally:
        admin.client_unpause()

    # the write breaker's open_s elapses (600 s above): the waiting purge is its probe, lands,
    # and is announced: the peer's memory copy goes too
    cache = gw.app[STATE].cache
    assert cache is not None and cache.redis is not None
    cache.redis.writes.breaker.open_s = 0
    until(lambda: not cache.redis.purges, "the purge never reached Redis")  # type: ignore[union-attr]
    until(lambda: _chat(peer.url, "purged during the stall") == "miss", "the peer was not told")
    admin.close()
