"""`limits.body_read_timeout_s` bounds every request body, the ones forwarded as they arrive too.

A passthrough body over 1 MiB is streamed to the replica as it comes. Only bodies read whole
had the deadline: a client that sent part of a large body and then stalled (or trickled a byte
now and then) held its request, a pooled upstream connection and a breaker slot for as long as
it liked: the route's `total` is not checked while the body is being sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from tests.conftest import base_config
from tests.support.servers import ServerThread


async def _stall(port: int, path: str, length: int, sent: int) -> bytes:
    """Send the head and `sent` bytes of a `length`-byte body, then nothing: the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), length)
        )
        writer.write(b"a" * sent)
        await writer.drain()
        # bounded only so that a gateway that never answers fails the test instead of hanging
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        size = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await asyncio.wait_for(reader.readexactly(size), 60)
    finally:
        writer.close()


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_a_streamed_body_that_stalls_is_a_408(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], client: str
) -> None:
    cfg = base_config(upstream.url, limits={"body_read_timeout_s": 1})
    cfg["backends"]["upstream"]["pool"] = {"http_client": client}
    gw = start_gateway(cfg)
    # 3 MiB announced, 1.5 MiB sent: past the 1 MiB over which a passthrough body is streamed
    answer = await _stall(gw.port, "/any/echo", 3 << 20, 3 << 19)
    head, _, body = answer.partition(b"\r\n\r\n")
    # before: no answer at all (the stalled upload was waited for without end)
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert b"application/json" in head
    assert "did not arrive in time" in json.loads(body)["error"]["message"]
    # a body read whole (a parsed route) keeps its 408 too
    answer = await _stall(gw.port, "/v1/chat/completions", 1000, 10)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
