"""A client that sends requests for a large entry and reads nothing holds back only itself.

The one-block hit writer (gateway/hit_response.py) wrote each hit into the connection's send
buffer and let the handler go on to the next request the client had pipelined, where
web.Response waits for the buffer to drain: one client that pipelined 100 requests for a 4 MB
entry without reading had the gateway hold 400 MB. Now a hit waits for the buffer as any
response does; the requests behind it are read when the client reads.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from tests.support.servers import ServerThread

BIG = b"x" * (4 << 20)
PIPELINED = 20
MARKS = web.AppKey("marks", list)


def big_upstream() -> web.Application:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=BIG, content_type="application/octet-stream")

    async def mark(request: web.Request) -> web.Response:
        request.app[MARKS].append(time.monotonic())
        return web.Response(text="marked")

    app = web.Application()
    app[MARKS] = []
    app.router.add_get("/big", big)
    app.router.add_get("/mark", mark)
    return app


@pytest.fixture
def gw(start_gateway: Callable[..., ServerThread]) -> Iterator[tuple[ServerThread, list[float]]]:
    up = ServerThread(big_upstream).start()
    policy = {"enabled": True, "ttl": 600, "tiers": ["memory"], "max_entry_bytes": 16 << 20}
    route = {"name": "p", "match": {"prefix": "/"}, "backend": "upstream"}
    cfg = {
        "backends": {"upstream": {"kind": "remote", "replicas": [up.url]}},
        "routes": [{**route, "cache": {"exact": policy}}],
    }
    assert up.app is not None
    yield start_gateway(cfg), up.app[MARKS]
    up.stop()


async def test_pipelined_hits_wait_for_a_client_that_does_not_read(
    gw: tuple[ServerThread, list[float]],
) -> None:
    server, marks = gw
    host, port = "127.0.0.1", server.port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /big HTTP/1.1\r\nHost: gw\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(len(BIG))
    assert b"X-Cache: miss" in head
    writer.close()

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
    # many hits, then a request the upstream sees: it is reached only once the hits went out
    writer.write(b"GET /big HTTP/1.1\r\nHost: gw\r\n\r\n" * PIPELINED)
    writer.write(b"GET /mark HTTP/1.1\r\nHost: gw\r\n\r\n")
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # the first hit is on its way
    for _ in range(20):  # before, the mark came within milliseconds, every hit buffered
        await asyncio.sleep(0.1)
        assert not marks, "the gateway buffered every pipelined hit for a client not reading"
    # the client reads: every hit comes whole, then the mark's answer
    await reader.readexactly(len(BIG))
    for _ in range(PIPELINED - 1):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert b"X-Cache: hit" in head and b"Content-Length: %d" % len(BIG) in head
        await asyncio.wait_for(reader.readexactly(len(BIG)), 30)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200") and len(marks) == 1
    writer.close()
