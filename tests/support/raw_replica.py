"""A replica as a raw asyncio socket server: the test's script writes every byte, so it can
misbehave in ways no HTTP framework lets a server (lie about lengths, never read, send heads
no parser should take). It runs on the test's own event loop; the gateway runs in its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request: Content-Length or chunked bodies."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    if b"content-length:" in lower:
        n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(n)
    body = b""
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    return head, body


def json_answer(body: bytes, extra: bytes = b"") -> bytes:
    """A 200 application/json answer with its Content-Length (extra: more header lines)."""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


class RawReplica:
    """Runs `script` per connection on 127.0.0.1; counts connections and requests seen (the
    script calls `seen` for each request it read)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[None]] = set()

    def seen(self, head: bytes) -> None:
        self.requests.append(head.split(b"\r\n", 1)[0])

    async def _on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        # (cancelled by stop(): a script that sleeps or reads for ever ends there quietly)
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            await self.script(reader, writer)
        writer.close()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._on, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._handlers:  # scripts still sleeping or reading
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for w in self._writers:
            w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.wait_closed(), 1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)
