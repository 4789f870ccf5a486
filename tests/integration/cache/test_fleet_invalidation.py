"""An unsafe request's invalidation (RFC 9111 4.4) across processes: sidecars sharing one Redis
and `serve --workers 2`, each a real `latentgate serve` process with its own memory tier.

What a process must not do is answer a GET from its memory after a PUT or DELETE of that target
went through another process. The tests wait for each process's memory tier to let go of the
entry (a condition with a generous deadline, never a fixed delay), then ask again.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import (
    ALICE,
    BOB,
    entries_per_worker,
    memory_entries,
    request,
    until,
    upstream_calls,
)
from tests.support.redis_topologies import MASTER, RedisSentinelServers
from tests.support.servers import GatewayProcess, RedisServer, ServerThread


@pytest.mark.parametrize("method", ["DELETE", "PUT"])
def test_an_unsafe_request_on_one_sidecar_drops_the_get_from_the_others_memory(
    method: str,
    upstream: ServerThread,
    redis_server: RedisServer,
    processes: Callable[..., GatewayProcess],
) -> None:
    """A GET cached in both sidecars' memory; a DELETE (PUT) of its target through A: B asks
    the upstream again. Tenant isolation: bob's entry for the same target stays in both, and
    still answers bob with bob's own upstream answer."""
    cfg = cache_config(upstream.url, redis_server.url, routes=("default",))
    a, b = processes(cfg), processes(cfg)
    path = f"/items/{uuid.uuid4().hex[:8]}"
    assert request(a.url + path)[1]["X-Cache"] == "miss"
    assert request(b.url + path)[1]["X-Cache"] == "hit"  # from Redis, now in B's memory too
    assert request(b.url + path, auth=BOB)[1]["X-Cache"] == "miss"
    assert request(a.url + path, auth=BOB)[1]["X-Cache"] == "hit"
    assert memory_entries(a) == memory_entries(b) == 2

    status, headers, _ = request(a.url + path, method, body=b"new" if method == "PUT" else None)
    assert (status, headers["X-Cache"]) == (200, "bypass")
    until(lambda: memory_entries(b) == 1, "B's memory still holds alice's entry")

    calls = upstream_calls(upstream, path)
    status, headers, doc = request(b.url + path)
    assert (status, headers["X-Cache"]) == (200, "miss")
    assert ["Authorization", ALICE] in doc["headers"]
    assert upstream_calls(upstream, path) > calls  # B's GET went upstream
    calls = upstream_calls(upstream, path)
    for gw in (a, b):  # bob's entry, bob's answer, in both sidecars
        status, headers, doc = request(gw.url + path, auth=BOB)
        assert (status, headers["X-Cache"]) == (200, "hit")
        assert ["Authorization", BOB] in doc["headers"]
    assert upstream_calls(upstream, path) == calls


def test_an_unsafe_request_on_one_sidecar_drops_the_get_from_redis_for_the_others(
    upstream: ServerThread,
    redis_server: RedisServer,
    processes: Callable[..., GatewayProcess],
) -> None:
    """The Redis tier alone: the sidecar that took the DELETE deletes the shared entry, so the
    other asks the upstream at once; bob's entry stays."""
    cfg = cache_config(upstream.url, redis_server.url, routes=("default",), tiers=["redis"])
    a, b = processes(cfg), processes(cfg)
    path = f"/items/{uuid.uuid4().hex[:8]}"
    assert request(a.url + path)[1]["X-Cache"] == "miss"
    assert request(b.url + path)[1]["X-Cache"] == "hit"
    assert request(b.url + path, auth=BOB)[1]["X-Cache"] == "miss"
    assert request(a.url + path, "DELETE")[0] == 200
    assert request(b.url + path)[1]["X-Cache"] == "miss"
    status, headers, doc = request(a.url + path, auth=BOB)
    assert (status, headers["X-Cache"]) == (200, "hit")
    assert ["Authorization", BOB] in doc["headers"]


def test_with_redis_stalled_or_gone_an_unsafe_request_still_invalidates_locally(
    upstream: ServerThread, processes: Callable[..., GatewayProcess]
) -> None:
    """Redis stopped (SIGSTOP: connections open, nothing answers) and then killed: the DELETE
    is answered (not a 500, not a hang) and this sidecar's own memory lets go of the GET."""
    redis = RedisServer().start()
    assert redis.proc is not None
    try:
        a = processes(cache_config(upstream.url, redis.url, routes=("default",)))
        path = f"/items/{uuid.uuid4().hex[:8]}"
        for stall in (signal.SIGSTOP, signal.SIGKILL):
            assert request(a.url + path)[1]["X-Cache"] in ("miss", "hit")
            assert request(a.url + path)[1]["X-Cache"] == "hit"  # from memory
            redis.proc.send_signal(stall)
            # (with Redis stalled the delete waits out the op deadline, 0.1 s, and the request
            # does not wait for the announcement too: that goes on in the background, within
            # the fan-out's socket timeout; a time, so not asserted here)
            status, headers, _ = request(a.url + path, "DELETE")
            assert (status, headers["X-Cache"]) == (200, "bypass")
            status, headers, _ = request(a.url + path)
            assert (status, headers["X-Cache"]) == (200, "miss")
            if stall == signal.SIGSTOP:
                redis.proc.send_signal(signal.SIGCONT)
    finally:
        if redis.proc.poll() is None:
            redis.proc.send_signal(signal.SIGCONT)
        redis.stop()


def _burst_reaches_the_other(a: GatewayProcess, b: GatewayProcess, n: int) -> None:
    """n GETs cached in both sidecars' memory; n DELETEs of them at once through A: every one
    reaches B's memory, and B asks the upstream again for each."""
    paths = [f"/items/{uuid.uuid4().hex[:8]}" for _ in range(n)]
    for p in paths:
        assert request(a.url + p)[1]["X-Cache"] == "miss"
        # from Redis, now in B's memory; or, where A's write ran out of the op deadline on a
        # loaded machine (a miss degrades to the upstream), B's own miss put it there
        assert request(b.url + p)[1]["X-Cache"] in ("hit", "miss")
    assert memory_entries(b) == n

    async def burst() -> list[int]:
        async with aiohttp.ClientSession(headers={"Authorization": ALICE}) as s:

            async def delete(p: str) -> int:
                async with s.delete(a.url + p) as r:
                    await r.read()
                    return r.status

            return await asyncio.gather(*(delete(p) for p in paths))

    assert set(asyncio.run(burst())) == {200}
    until(lambda: memory_entries(b) == 0, "B's memory still holds deleted targets")
    assert all(request(b.url + p)[1]["X-Cache"] == "miss" for p in paths)


@pytest.mark.slow
def test_a_burst_of_unsafe_requests_reaches_the_others_memory(
    upstream: ServerThread,
    redis_server: RedisServer,
    processes: Callable[..., GatewayProcess],
) -> None:
    """150 DELETEs at once through A, Redis healthy: the busy process spends the op deadline
    on its own work, and an announcement that takes longer is sent on in the background, not
    dropped (before, from a quarter to a half of them timed out or were not sent, and B kept
    serving those targets)."""
    cfg = cache_config(upstream.url, redis_server.url, routes=("default",))
    _burst_reaches_the_other(processes(cfg), processes(cfg), 150)


@pytest.mark.slow
def test_a_burst_of_unsafe_requests_on_sentinel_reaches_the_others_memory(
    upstream: ServerThread, processes: Callable[..., GatewayProcess]
) -> None:
    """Sentinel (a cluster's pools are the same): its connection pools refuse, not queue, past
    their max_connections. 32 DELETEs at once through A, Redis healthy: every one of them
    reaches B's memory (before, the fan-out had 8 connections, the tail's among them, and most
    announcements of the burst failed with "Too many connections": B kept serving them)."""
    topo = RedisSentinelServers().start()
    try:
        cfg = cache_config(upstream.url, topo.url, routes=("default",))
        cfg["cache"]["redis"].update({"mode": "sentinel", "sentinel_master": MASTER})
        _burst_reaches_the_other(processes(cfg), processes(cfg), 32)
    finally:
        topo.stop()


def _in_every_worker(gw: GatewayProcess, path: str, count: int) -> None:
    """GETs (new connections) until each of the workers holds `count` entries in memory."""

    def filled() -> bool:
        request(gw.url + path)
        per = entries_per_worker(gw)
        return len(per) == 2 and all(n == count for n in per.values())

    until(filled, "a GET cached in both workers' memory")


def test_an_unsafe_request_on_one_worker_drops_the_get_from_the_others_memory(
    upstream: ServerThread,
    redis_server: RedisServer,
    processes: Callable[..., GatewayProcess],
) -> None:
    """`serve --workers 2` on a Redis: each worker has its own memory tier, and a DELETE that
    one of them took reaches the other's through the purge fan-out."""
    cfg = cache_config(upstream.url, redis_server.url, routes=("default",))
    gw = processes(cfg, workers=2)
    path = f"/items/{uuid.uuid4().hex[:8]}"
    _in_every_worker(gw, path, 1)
    assert request(gw.url + path, "DELETE")[0] == 200
    until(
        lambda: set(entries_per_worker(gw).values()) == {0},
        "a worker's memory still holds the deleted target's entry",
    )
    calls = upstream_calls(upstream, path)
    assert request(gw.url + path)[1]["X-Cache"] == "miss"
    assert upstream_calls(upstream, path) > calls


def test_without_redis_an_unsafe_request_reaches_the_other_workers(
    upstream: ServerThread, processes: Callable[..., GatewayProcess]
) -> None:
    """`serve --workers 2`, memory only: the worker that takes a DELETE tells the other over its
    private unix socket (gateway/worker_drops.py), and answers the client once it has: both
    memory tiers are empty when the DELETE's answer arrives, and only that tenant's entry went.
    Before, the other worker served its copy until its TTL (a strict xfail)."""
    cfg = cache_config(upstream.url, routes=("default",), tiers=["memory"])
    gw = processes(cfg, workers=2)
    path = f"/items/{uuid.uuid4().hex[:8]}"
    _in_every_worker(gw, path, 1)
    for _ in range(8):  # bob's copy of the same target, in whichever workers his GETs reach
        request(gw.url + path, auth=BOB)
    bob = sum(entries_per_worker(gw).values()) - 2
    assert bob >= 1
    assert request(gw.url + path, "DELETE")[0] == 200
    assert sum(entries_per_worker(gw).values()) == bob  # told before the answer: alice's gone
    calls = upstream_calls(upstream, path)
    assert request(gw.url + path)[1]["X-Cache"] == "miss"
    assert upstream_calls(upstream, path) == calls + 1
