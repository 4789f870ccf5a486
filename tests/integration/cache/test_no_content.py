"""A stored 204 is replayed as a 204 is sent: without Content-Length (RFC 9110 8.6: a server
MUST NOT send one with a 204) and without a body. Before, the one-block hit writer gave it
`Content-Length: 0`, which its miss (aiohttp's writer) never had."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread, one_route, running


async def _no_content(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"X-Done": "yes"})


@pytest.fixture
def no_content_upstream() -> Iterator[ServerThread]:
    with running(one_route("/{tail:.*}", _no_content, method="*")) as server:
        yield server


async def _exchange(port: int, requests: list[bytes]) -> list[str]:
    """The response heads, read off one keep-alive connection (a 204 ends at its head)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    heads = []
    for req in requests:
        writer.write(req)
        heads.append((await reader.readuntil(b"\r\n\r\n")).decode("latin-1"))
    writer.close()
    await writer.wait_closed()
    return heads


@pytest.mark.parametrize("tier", ["memory", "redis"])
async def test_a_stored_204_has_no_content_length(
    request: pytest.FixtureRequest,
    no_content_upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    tier: str,
) -> None:
    redis = request.getfixturevalue("redis_server").url if tier == "redis" else None
    gw = start_gateway(cache_config(no_content_upstream.url, redis, tiers=[tier]))
    get = b"GET /done HTTP/1.1\r\nHost: gw\r\n\r\n"
    head = b"HEAD /done HTTP/1.1\r\nHost: gw\r\n\r\n"
    heads = await _exchange(gw.port, [get, get, head])
    for h, x_cache in zip(heads, ["miss", "hit", "hit"], strict=True):
        lines = [line.lower() for line in h.split("\r\n")]
        assert lines[0] == "http/1.1 204 no content", h
        assert f"x-cache: {x_cache}" in lines and "x-done: yes" in lines, h
        assert not [line for line in lines if line.startswith("content-length")], h
        assert not [line for line in lines if line.startswith("transfer-encoding")], h
