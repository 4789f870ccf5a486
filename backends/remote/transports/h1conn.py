"""One keep-alive HTTP/1.1 client connection: an asyncio Protocol that writes a request and
parses its response with httptools (llhttp, the parser Node.js uses).

The aiohttp client costs about as much CPU per request as the rest of a pass-through together
(ClientRequest, payload registry, timers, a StreamReader, a CIMultiDict per response); a replica
beside the gateway needs none of that. This connection does exactly one thing at a time: the
transport (lean_http1.py) writes one request, then reads the response from here.

Timeouts are loop timers on the waiting future (no asyncio.timeout context per read), and the
protocol applies backpressure: reading pauses while more than `_HIGH_WATER` bytes of body wait
for a slow consumer.
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from typing import cast

import httptools

_HIGH_WATER = 1 << 18
# A response head as aiohttp's client bounds one (so pool.http_client changes nothing but CPU):
# a status line or header field of at most 8190 bytes, at most 128 fields. llhttp has no bound
# of its own: a replica could grow a head (or one field, which httptools gathers whole) without
# end, and a head past what clients read (aiohttp's 8190-byte field, h11's 16 KiB) was
# passed on, cached, and failed every client that was served it.
MAX_LINE = 8190
MAX_FIELDS = 128
_MAX_HEAD = (MAX_FIELDS + 1) * (MAX_LINE + 2)


class ConnectionClosed(Exception):
    """The peer closed the connection before the response was complete."""


class ReadTimeout(Exception):
    """No bytes arrived within the read timeout (or the request's deadline passed)."""


class BadResponse(Exception):
    """The peer's bytes are not an HTTP/1.1 response."""


class H1Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._poller: select.poll | None = None  # for quiet()
        # A response is owed to us only between start() and its end: bytes outside that window
        # are no answer to anything, and the next request's client must never read them.
        self._expecting = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.done = False
        self.keep_alive = True
        self.chunked = False
        self.length: int | None = None
        self.exc: Exception | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._head_bytes = 0  # bytes read before the head was complete (1xx heads included)
        self._refused: str | None = None  # why a callback stopped the parser

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._expecting:
            self._unsolicited()
            return
        heading = not self.headers_done
        if heading:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(self._refused or f"unparsable response: {exc}"))
        if heading and not self.headers_done and self._head_bytes > _MAX_HEAD:
            self._fail(BadResponse(f"a response head over {_MAX_HEAD} bytes"))
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.done and self.length is None and not self.chunked:
            self.done = True  # a body delimited by the connection's end (RFC 9112 6.3 item 8)
        elif not self.done and self.exc is None:
            self.exc = ConnectionClosed(str(exc) if exc else "closed by the peer")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # --- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._expecting:  # a second response behind the one asked for, in one read
            self._unsolicited()

    def on_status(self, status: bytes) -> None:
        if self._expecting:
            self.reason += status
            if len(self.reason) > MAX_LINE:
                self._refuse(f"a status line over {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._expecting:
            if len(name) + len(value) > MAX_LINE:
                self._refuse(f"a header field over {MAX_LINE} bytes")
            if len(self.headers) >= MAX_FIELDS:
                self._refuse(f"more than {MAX_FIELDS} header fields")
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if not self._expecting:
            return
        code = self._parser.get_status_code()
        if 100 <= code < 200:  # 1xx: informational, the real response follows
            self.reason = b""
            self.headers = []
            return
        self.status = code
        self.keep_alive = self._parser.should_keep_alive()
        for name, value in self.headers:
            low = name.lower()
            if low == b"content-length":
                self.length = int(value) if value.strip().isdigit() else None
            elif low == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
        self.headers_done = True
        self._wake()
        if self.refuses_body and self._drain is not None and not self._drain.done():
            # the writer stops waiting for a replica that may read no more of the body
            self._drain.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self._expecting:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        if self._expecting and self.headers_done:  # (a 1xx completes before the real one)
            self.done = True
            self._expecting = False
            self._wake()

    # --- the transport's side -------------------------------------------------------------------

    @property
    def refuses_body(self) -> bool:
        """An answer that ends the request before its body was all sent (RFC 9112 9.5): an
        error or a redirect. A replica that answers that way (a 413, a 401) may read no more of
        the body; one that answers 2xx early (even with `Connection: close`) reads on."""
        return self.headers_done and self.status >= 300

    def start(self, data: bytes | list[bytes]) -> None:
        """Write a request (head and, when whole, body) and get ready for its response."""
        self._reset()
        self._expecting = True
        assert self.transport is not None
        if isinstance(data, bytes):
            self.transport.write(data)
        else:
            self.transport.writelines(data)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self, within_s: float) -> None:
        if self.closed:
            raise ConnectionClosed("closed while the request body was sent")
        if self._drain is not None and not self._drain.done():
            # bounded like a read: a replica that stops taking the body (hung, its buffers
            # full) held the request and its client for good
            timer = self.loop.call_later(within_s, self._stalled, self._drain)
            try:
                await self._drain
            finally:
                timer.cancel()
            if self.exc is not None:
                raise self.exc

    def _stalled(self, drain: asyncio.Future[None]) -> None:
        if not drain.done():
            self.exc = ReadTimeout()
            drain.set_result(None)

    async def wait(self, within_s: float) -> None:
        """Until there is something new (headers, body bytes, the end or an error)."""
        if self.exc is not None:
            raise self.exc
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(within_s, self._timed_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self.exc is not None:
            raise self.exc

    def take(self) -> bytes:
        """The body bytes received so far (b"" when none)."""
        if not self._chunks:
            return b""
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def has_body(self) -> bool:
        return bool(self._chunks)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def quiet(self) -> bool:
        """Nothing waits unread in an idle connection's socket (urllib3's check before it
        reuses one). A replica that hangs up right after its answer, without `Connection:
        close`, has its FIN there before the loop reads it: a request written then is lost
        unsent, and one that may not be retried (a POST on a passthrough route) was a 502."""
        if self._poller is None:
            sock = self.transport.get_extra_info("socket") if self.transport else None
            if sock is None:
                return self.transport is not None
            self._poller = select.poll()  # (one per connection: a reuse costs one poll(2))
            self._poller.register(sock.fileno(), select.POLLIN)
        return not self._poller.poll(0)

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed and self.exc is None

    def _unsolicited(self) -> None:
        """Bytes no request asked for (a replica that answered twice, or sent garbage while the
        connection sat idle): the connection is out of step and is closed, never reused. The
        response already read, if any, stays whole."""
        self.keep_alive = False
        self.close()

    def _refuse(self, why: str) -> None:
        """Stop the parser from a callback (it raises HttpParserCallbackError, which
        data_received turns into BadResponse(why))."""
        self._refused = why
        raise BadResponse(why)

    def _fail(self, exc: Exception) -> None:
        self.exc = exc
        self.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _timed_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self.exc = ReadTimeout()
            waiter.set_result(None)
