"""A raw chunked upload through the gateway, for replicas that answer before the body is in (or
never read it): the answer is read while the upload is still being written."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

CHUNK = 65536


async def chunked_upload(url: str, chunks: int, bound_s: float) -> tuple[bytes, dict[str, Any]]:
    """POST /upload of `chunks` x 64 KiB, chunked: (head, JSON body) of the answer, or a
    timeout past `bound_s`. The upload is then written to its end and the client hangs up and
    waits for the gateway to close: the gateway reads out a body left unread after its answer
    (aiohttp's lingering close, up to 10 s), and a reset does not end that read, which then
    holds the gateway's shutdown in the test's teardown."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n")

    async def feed() -> None:
        chunk = b"x" * CHUNK
        for _ in range(chunks):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        writer.write_eof()

    feeding = asyncio.create_task(feed())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), bound_s)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = json.loads(await asyncio.wait_for(reader.readexactly(length), bound_s))
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(feeding, bound_s)
            await asyncio.wait_for(reader.read(), bound_s)  # the gateway's close
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        writer.transport.abort()
    return head, body
