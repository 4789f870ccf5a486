"""/readyz and /v2/health/ready: the gateway's own readiness, each part's real state in the body,
and backends that readiness waits on only when the config requires them."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest

from gateway.config import ConfigError, parse_settings
from tests.conftest import base_config
from tests.support.servers import RedisServer, ServerThread


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A bound, never listening port: connections to it are refused."""
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{dead.getsockname()[1]}"


async def _ready(url: str) -> tuple[int, dict[str, Any], int]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/readyz") as r:
            body = await r.json()
            status = r.status
        async with s.get(url + "/v2/health/ready") as r:
            return status, body, r.status


async def test_unreached_upstream_is_reported_but_not_required(
    dead_url: str, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(base_config(dead_url))
    status, body, v2 = await _ready(gw.url)
    assert status == 200 and v2 == 200 and body["ready"] is True
    replica = body["backends"]["upstream"]["replicas"][0]
    assert replica["state"] == "unknown" and replica["healthy"] is False
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"}) as r,
    ):
        assert r.status == 502
    status, body, _ = await _ready(gw.url)
    assert status == 200
    assert body["backends"]["upstream"]["replicas"][0]["state"] == "unreachable"


async def test_a_required_backend_gates_readiness(
    dead_url: str, upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    check = {"path": "/health", "interval_s": 0.1, "timeout_s": 0.5}
    cfg = base_config(dead_url, readiness={"require": ["upstream"]})
    cfg["backends"]["upstream"]["health_check"] = check
    down = start_gateway(cfg)
    cfg = base_config(upstream.url, readiness={"require": ["upstream"]})
    cfg["backends"]["upstream"]["health_check"] = check
    up = start_gateway(cfg)
    deadline = time.monotonic() + 10
    while (await _ready(up.url))[0] != 200:
        assert time.monotonic() < deadline, "the reachable upstream never made the gateway ready"
        await asyncio.sleep(0.05)
    status, body, v2 = await _ready(up.url)
    assert body["backends"]["upstream"]["replicas"][0]["state"] == "healthy"
    status, body, v2 = await _ready(down.url)
    assert status == 503 and v2 == 503 and body["ready"] is False
    assert body["backends"]["upstream"]["required"] is True


def test_require_names_a_known_remote_backend_with_a_health_check() -> None:
    import yaml

    cfg = base_config("http://127.0.0.1:9", readiness={"require": ["nope"]})
    with pytest.raises(ConfigError, match=r"readiness\.require names 'nope'"):
        parse_settings(yaml.safe_dump(cfg))
    cfg = base_config("http://127.0.0.1:9", readiness={"require": ["upstream"]})
    with pytest.raises(ConfigError, match="give it a health_check"):
        parse_settings(yaml.safe_dump(cfg))


async def test_readyz_shows_redis_state_without_requiring_it(
    redis_server: RedisServer, dead_url: str, start_gateway: Callable[..., ServerThread]
) -> None:
    live = start_gateway(base_config(dead_url, cache={"redis": {"url": redis_server.url}}))
    status, body, _ = await _ready(live.url)
    assert status == 200 and body["redis"]["reachable"] is True
    gone = dead_url.replace("http://", "redis://")
    down = start_gateway(base_config(dead_url, cache={"redis": {"url": gone}}))
    status, body, _ = await _ready(down.url)
    assert status == 200 and body["redis"]["reachable"] is False and body["redis"]["error"]
