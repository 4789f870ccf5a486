"""Redis killed, or stalled, under load: every request is still answered, none hangs."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import RedisServer, ServerThread


async def _load(url: str, seconds: float, during: Callable[[], None], at: float) -> list[int]:
    """20 clients for `seconds`, half repeated prompts, half new ones (misses that reach Redis);
    calls `during` after `at` seconds."""
    statuses: list[int] = []
    failures: list[str] = []
    conn = aiohttp.TCPConnector(limit=0)
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=5)) as s:

        async def client(c: int) -> None:
            i = c
            while time.monotonic() < stop:
                q = f"q{i % 30}" if i % 2 else f"u{i}"
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": q}],
                    "temperature": 0,
                }
                try:
                    async with s.post(url + "/v1/chat/completions", json=body) as r:
                        data = json.loads(await r.read())
                        ok = (
                            r.status == 200
                            and data["choices"][0]["message"]["content"] == f"echo(up): {q}"
                        )
                        statuses.append(r.status if ok else -r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    statuses.append(0)  # failed or hung past the client timeout
                    failures.append(f"{q}: {type(exc).__name__}: {exc}")
                i += 7

        async def fault() -> None:
            await asyncio.sleep(at)
            await asyncio.to_thread(during)

        await asyncio.gather(fault(), *(client(c) for c in range(20)))
    if failures:  # say what the client saw, not only that something failed
        print("client failures:", *failures[:10], sep="\n  ")
    return statuses


@pytest.mark.slow
async def test_redis_killed_under_load_no_failed_requests(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    redis = RedisServer().start()
    try:
        gw = start_gateway(cache_config(upstream.url, redis.url))
        statuses = await _load(gw.url, 3.0, redis.kill, at=1.0)
        assert len(statuses) > 100
        assert set(statuses) == {200}
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/metrics") as r:
                text = await r.text()
            async with s.get(
                gw.url + "/admin/cache/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as r:
                stats = await r.json()
        assert "latentgate_cache_redis_errors_total" in text
        # open, or half-open when open_s has passed since and a request may probe: either way
        # Redis is not used (a slow machine reaches this line after open_s)
        assert re.search(r"^latentgate_cache_redis_breaker_state [12]\.0$", text, re.M), text
        assert stats["tiers"]["redis"]["breaker"] in ("open", "half-open")
        assert "error" in stats["tiers"]["redis"]
        # Redis comes back: the breaker probes it and closes; L2 is used again
        redis.start()
        await asyncio.sleep(2.2)
        async with aiohttp.ClientSession() as s:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "after"}],
                "temperature": 0,
            }
            for _ in range(3):
                async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
            async with s.get(gw.url + "/metrics") as r:
                assert "latentgate_cache_redis_breaker_state 0.0" in await r.text()
    finally:
        redis.stop()


@pytest.mark.slow
async def test_stalled_redis_costs_a_short_timeout_not_a_hang(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    redis = RedisServer().start()
    try:
        gw = start_gateway(cache_config(upstream.url, redis.url))

        def stall() -> None:
            import subprocess

            subprocess.run(
                ["redis-cli", "-p", str(redis.port), "DEBUG", "SLEEP", "1.5"],
                check=False,
                capture_output=True,
                timeout=10,
            )

        statuses = await _load(gw.url, 3.0, stall, at=0.5)
        assert len(statuses) > 100
        assert set(statuses) == {200}
    finally:
        redis.stop()
