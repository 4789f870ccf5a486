"""A replica that stops reading a streamed request body times out like one that stops answering.

The lean transport waited for the replica's socket to drain without a timer: a replica that
took the head and then read nothing (hung, or its buffers full) held the request, its pooled
connection and the client for good, past the route's `total`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.errors import UpstreamTimeout
from tests.unit.backends.test_http1_transports import KINDS, Replica, make, post


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _body(chunks: int) -> AsyncIterator[bytes]:
    for _ in range(chunks):
        yield b"a" * (1 << 20)


async def test_a_replica_that_stops_reading_the_body_times_out(kind: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(30)  # reads no byte of the body (the test ends it sooner)

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url, read=0.5, total=1.0)
    try:
        # 64 MiB: far more than loopback's socket buffers take without the replica reading
        request = post(_body(64), headers=[("Content-Length", str(64 << 20))])
        with pytest.raises(UpstreamTimeout):
            # (bounded only so that a transport that waits for ever fails instead of hanging)
            await asyncio.wait_for(tr.send(request), 20)
        assert tr.connections_in_use() == 0
    finally:
        await tr.aclose()
        await replica.stop()
