"""A client that stops reading a streamed answer: the route's total bounds the exchange, so the
replica's stream, its pooled connection and its in-flight slot are let go when it passes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.fault.conftest import metric, pool_config
from tests.support.servers import ServerThread

StartGateway = Callable[..., ServerThread]


class _Endless:
    """An upstream that streams as fast as it is read, and counts the streams still open."""

    def __init__(self) -> None:
        self.open = 0

    def app(self) -> web.Application:
        async def big(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            await resp.prepare(request)
            self.open += 1
            try:
                for _ in range(16_000):  # 1 GiB: far more than any socket buffers hold
                    await resp.write(b"x" * 65536)
            except ConnectionError:
                pass
            finally:
                self.open -= 1
            return resp

        async def small(request: web.Request) -> web.Response:
            return web.Response(text="small")

        app = web.Application()
        app.router.add_get("/big", big)
        app.router.add_get("/small", small)
        return app


@pytest.fixture
def endless() -> Iterator[tuple[_Endless, ServerThread]]:
    up = _Endless()
    server = ServerThread(up.app).start()
    try:
        yield up, server
    finally:
        server.stop()


async def test_a_client_that_stops_reading_does_not_hold_the_replica(
    endless: tuple[_Endless, ServerThread], start_gateway: StartGateway
) -> None:
    up, server = endless
    routes: list[dict[str, Any]] = [
        {
            "name": "files",
            "match": {"prefix": "/"},
            "backend": "pool",
            "upstream": {"timeouts": {"total": 1}, "retries": {"max": 0}},
        }
    ]
    # one in-flight slot: a stream held for ever would stall every other request too
    gw = start_gateway(pool_config([server.url], routes, breaker={"max_in_flight": 1}))
    host, port = gw.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)))
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /big HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert stalled.recv(64).startswith(b"HTTP/1.1 200")  # then it reads no more
        for _ in range(300):
            if up.open == 0:
                break
            await asyncio.sleep(0.05)
        assert up.open == 0, "the replica's stream is still held open for the stalled client"
        # The replica (another thread) sees the hang-up as the gateway's handler closes the
        # stream, a moment before that handler hands back its one in-flight slot: the next
        # request gets it once the handler is done (a 504 before it, under load).
        got: tuple[int, str] = (0, "")
        for _ in range(100):
            async with aiohttp.ClientSession() as s, s.get(gw.url + "/small") as r:
                got = (r.status, await r.text())
            if got[0] != 504:
                break
            await asyncio.sleep(0.05)
        assert got == (200, "small")
        assert await metric(gw.url, "latentgate_upstream_errors_total", kind="stream_cut") == 1
    finally:
        stalled.close()


async def test_a_slow_upload_on_a_cached_route_keeps_its_whole_budget(
    upstream: ServerThread, start_gateway: StartGateway
) -> None:
    """The route's total bounds the upstream exchange and the waits for another request's
    answer, not the client's own upload: a body that takes longer than the total to arrive is
    answered, on a cached route as on any other."""
    from tests.integration.cache.conftest import cache_config

    cfg = cache_config(upstream.url, tiers=["memory"])
    for r in cfg["routes"]:
        r["upstream"] = {"timeouts": {"total": 1}}
    gw = start_gateway(cfg)
    body = b'{"model":"m","temperature":0,"messages":[{"role":"user","content":"slow upload"}]}'
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10]
        )
        await writer.drain()
        await asyncio.sleep(1.5)  # longer than the route's total
        writer.write(body[10:])
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()
        await writer.wait_closed()
    assert head.startswith(b"HTTP/1.1 200"), head
