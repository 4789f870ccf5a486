"""Single flight through the gateway: many identical concurrent misses → one upstream call.

In one process (200 requests) and across two gateway processes sharing a Redis lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

BODY = {"model": "m", "messages": [{"role": "user", "content": "coalesce me"}], "temperature": 0}
ANSWER = "echo(up): coalesce me"


async def _many(
    urls: list[str], n: int, body: dict[str, object], headers: dict[str, str]
) -> list[tuple[int, str, str]]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as s:

        async def one(i: int) -> tuple[int, str, str]:
            async with s.post(
                urls[i % len(urls)] + "/v1/chat/completions", json=body, headers=headers
            ) as r:
                data = await r.read()
                text = (
                    json.loads(data)["choices"][0]["message"]["content"] if r.status == 200 else ""
                )
                return r.status, r.headers.get("X-Cache", ""), text

        return await asyncio.gather(*(one(i) for i in range(n)))


async def _calls(upstream: ServerThread) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get("/v1/chat/completions", 0))


async def test_200_identical_concurrent_requests_one_upstream_call(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    results = await _many([gw.url], 200, BODY, {"X-Test-Delay": "0.5"})
    assert [r[0] for r in results] == [200] * 200
    assert all(r[2] == ANSWER for r in results)
    assert await _calls(upstream) == 1


async def test_leader_error_is_shared_not_retried(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = cache_config(upstream.url)
    # Isolate single flight: the pool's own retries of a 503 are a separate, budgeted feature.
    for route in cfg["routes"]:
        route["upstream"] = {"retries": {"max": 0}}
    gw = start_gateway(cfg)
    # (the leader's call lasts long enough that all 50 join it on a loaded machine too: at 0.3 s
    # a few arrived after it had ended, and made a flight of their own)
    results = await _many([gw.url], 50, BODY, {"X-Test-Delay": "2", "X-Test-Status": "503"})
    assert [r[0] for r in results] == [503] * 50
    assert await _calls(upstream) == 1


@pytest.mark.slow
async def test_two_processes_share_entries_and_one_lease(
    upstream: ServerThread, redis_server: RedisServer
) -> None:
    cfg = cache_config(upstream.url, redis_server.url)
    # The lease is best effort: a Redis op that times out on this busy machine means "compute".
    cfg["cache"]["redis"]["timeouts"] = {"op": 1.0, "connect": 2.0}
    a, b = GatewayProcess(cfg).start(), GatewayProcess(cfg).start()
    try:
        # a miss in one process is a hit in the other
        solo = {**BODY, "messages": [{"role": "user", "content": "solo"}]}
        first = await _many([a.url], 1, solo, {})
        second = await _many([b.url], 1, solo, {})
        assert first[0][:2] == (200, "miss") and second[0][:2] == (200, "hit")
        assert second[0][2] == "echo(up): solo"
        # identical concurrent misses on both processes: one upstream call through the Redis lease
        results = await _many([a.url, b.url], 60, BODY, {"X-Test-Delay": "0.5"})
        assert [r[0] for r in results] == [200] * 60
        assert all(r[2] == ANSWER for r in results)
        calls = await _calls(upstream)
        if calls != 2:
            async with aiohttp.ClientSession() as s:
                for g in (a, b):
                    async with s.get(g.url + "/metrics") as r:
                        print(
                            [x for x in (await r.text()).splitlines() if "redis_errors_total" in x]
                        )
        assert calls == 2
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
async def test_a_peer_process_lease_never_hands_back_an_answer_the_request_refused(
    upstream: ServerThread, redis_server: RedisServer
) -> None:
    """While another process holds the lease for a key, a no-cache or max-age request waits for
    that process's fresh answer: the older entry already in Redis is exactly what it refused."""
    cfg = cache_config(upstream.url, redis_server.url)
    cfg["cache"]["redis"]["timeouts"] = {"op": 1.0, "connect": 2.0}
    a, b = GatewayProcess(cfg).start(), GatewayProcess(cfg).start()
    url = "/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as s:

            async def ask(gw: GatewayProcess, headers: dict[str, str]) -> tuple[str, int]:
                async with s.post(gw.url + url, json=BODY, headers=headers) as r:
                    assert r.status == 200
                    await r.read()
                    return r.headers.get("X-Cache", ""), int(r.headers.get("Age", "0"))

            for refusal in ({"Cache-Control": "no-cache"}, {"Cache-Control": "max-age=1"}):
                await ask(a, {"Cache-Control": "no-cache"})  # goes upstream and is stored
                await asyncio.sleep(2.2)  # that entry is now over 2 s old
                leader = asyncio.create_task(
                    ask(a, {"Cache-Control": "no-cache", "X-Test-Delay": "1.0"})
                )
                await asyncio.sleep(0.3)  # a holds the lease and computes
                _, age = await ask(b, refusal)
                await leader
                assert age <= 1, (refusal, age)  # a's fresh answer, not the 2 s old one
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
async def test_a_lease_whose_holder_died_costs_half_the_budget_not_the_lease(
    upstream: ServerThread, redis_server: RedisServer
) -> None:
    """The process holding the lease dies with it: a request waiting on that lease in another
    process waits at most half its route's total, then computes itself with the other half and
    is answered, long before the lease's 20 s run out."""
    cfg = cache_config(upstream.url, redis_server.url)
    cfg["cache"]["redis"]["timeouts"] = {"op": 1.0, "connect": 2.0}
    cfg["cache"]["redis"]["lease"] = {"ttl_ms": 20000}
    for r in cfg["routes"]:
        r["upstream"] = {"timeouts": {"total": 3}, "retries": {"max": 0}}
    a, b = GatewayProcess(cfg).start(), GatewayProcess(cfg).start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:

            async def ask(gw: GatewayProcess, headers: dict[str, str]) -> tuple[int, str]:
                url = gw.url + "/v1/chat/completions"
                async with s.post(url, json=BODY, headers=headers) as r:
                    await r.read()
                    return r.status, r.headers.get("X-Cache", "")

            leader = asyncio.create_task(ask(a, {"X-Test-Delay": "5"}))
            for _ in range(100):
                if await _calls(upstream) == 1:
                    break
                await asyncio.sleep(0.05)
            a.stop(signal.SIGKILL)  # its lease stays in Redis for the lease's ttl
            with contextlib.suppress(aiohttp.ClientError):
                await leader
            assert await ask(b, {}) == (200, "miss")
        assert await _calls(upstream) == 2
    finally:
        a.stop()
        b.stop()
