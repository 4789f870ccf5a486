"""A raw replica that answers every request with an endless chunked body, and counts what it
managed to send before its reader closed the connection: a reader that caps what it holds
closes early, one that buffers the whole body reads all of OFFER."""

from __future__ import annotations

import asyncio

from tests.support.raw_replica import RawReplica, read_request

# What the replica offers: far more than any cap here (and than a test could buffer quickly).
OFFER = 256 << 20
# Bytes that may be in flight when the reader closes: loopback's socket buffers on both sides
# and the reader's own read-ahead (aiohttp's and the lean parser's). Generous, yet a small
# fraction of OFFER: an uncapped read would hold all of OFFER, or time out still reading.
IN_FLIGHT = 32 << 20


class EndlessReplica:
    """Answers every request with `status` and a chunked body that never ends; counts the
    body bytes it managed to write before the reader closed the connection."""

    def __init__(self, status: int = 200, content_type: bytes = b"application/json") -> None:
        self.status = status
        self.content_type = content_type
        self.sent = 0
        self.closed = asyncio.Event()
        self.raw = RawReplica(self._script)

    async def _script(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        self.raw.seen(head)
        writer.write(
            b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
            % (self.status, self.content_type)
        )
        chunk = b"[" + b"0," * 32767 + b"0"  # (a JSON array that never closes)
        framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
        try:
            while self.sent < OFFER:
                writer.write(framed)
                await writer.drain()
                self.sent += len(chunk)
        finally:
            self.closed.set()
