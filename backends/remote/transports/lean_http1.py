"""HTTP/1.1 to one plain-text replica (`http://host:port` or `unix:/path.sock`) over pooled
keep-alive connections of our own (h1conn.py), without the aiohttp client.

It keeps Http1Transport's contract exactly: the same timeouts (connect, read between bytes,
total per request, a tighter per-request deadline sent as X-Latentgate-Deadline-Ms), the same
buffering rule (a Content-Length body up to 1 MiB that is not an event stream is read whole),
the same streamed-body semantics (closing early closes the connection; a body read to the end
returns it to the pool) and the same BackendError tree with the same messages. `https://`
replicas stay on Http1Transport (transports.factory.make_transport): TLS costs dwarf what this
saves.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import (
    RequestBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from backends.remote.transports.h1conn import (
    BadResponse,
    ConnectionClosed,
    H1Connection,
    ReadTimeout,
)
from backends.remote.transports.http1 import read_whole, with_deadline
from backends.remote.transports.response_head import response_head
from backends.settings import PoolLimits, Timeouts

_NO_LENGTH_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})


class _Request:
    """One request's deadline: reads wait at most the read timeout, and never past it."""

    __slots__ = ("deadline", "read_s")

    def __init__(self, total_s: float, read_s: float) -> None:
        self.deadline = time.monotonic() + total_s
        self.read_s = read_s

    def next_wait(self) -> float:
        return max(0.0, min(self.read_s, self.deadline - time.monotonic()))


class LeanHttp1Transport:
    """Pooled HTTP/1.1 to one replica; the Transport protocol (transports/base.py)."""

    def __init__(self, url: str, limits: PoolLimits, timeouts: Timeouts) -> None:
        self.url = url
        self._timeouts = timeouts
        self._limits = limits
        self._unix: str | None = None
        if url.startswith("unix:"):
            self._unix = url[len("unix:") :]
            self._host, self._port, host_header = "localhost", 0, "localhost"
        else:
            parts = urlsplit(url)
            if parts.scheme != "http" or parts.hostname is None:
                raise ValueError(f"LeanHttp1Transport speaks plain http:// or unix:, not {url}")
            self._host, self._port = parts.hostname, parts.port or 80
            host_header = parts.netloc.rpartition("@")[2]  # as aiohttp sends it: no userinfo
        self._host_line = f"Host: {host_header}\r\n"
        self._idle: list[H1Connection] = []  # LIFO: the warmest connection first
        self._busy: set[H1Connection] = set()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._connecting = 0
        self._closed = False

    # --- the pool -------------------------------------------------------------------------------

    async def _acquire(self, connect_s: float) -> H1Connection:
        while True:
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                fresh = now - conn.idle_since < self._limits.keepalive_s
                if not conn.closed and fresh and conn.quiet():
                    self._busy.add(conn)
                    return conn
                conn.close()
            if len(self._busy) + self._connecting < self._limits.max_connections:
                break
            slot = asyncio.get_running_loop().create_future()
            self._waiting.append(slot)
            await slot  # bounded by the caller: the pool's breaker and the client's deadline
        loop = asyncio.get_running_loop()
        self._connecting += 1  # holds the slot while connecting
        try:
            async with asyncio.timeout(connect_s):
                if self._unix is not None:
                    _, conn = await loop.create_unix_connection(
                        lambda: H1Connection(loop), self._unix
                    )
                else:
                    _, conn = await loop.create_connection(
                        lambda: H1Connection(loop), self._host, self._port
                    )
        except BaseException:
            self._connecting -= 1
            self._wake_one()  # the slot it held is free again
            raise
        self._connecting -= 1
        self._busy.add(conn)
        return conn

    def _release(self, conn: H1Connection) -> None:
        if conn not in self._busy:
            return
        self._busy.discard(conn)
        if conn.reusable() and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                break

    # --- one request ----------------------------------------------------------------------------

    def _head(
        self,
        request: UpstreamRequest,
        headers: list[tuple[str, str]],
        length: int | None,
        chunked: bool,
    ) -> bytes:
        lines = [f"{request.method} {request.path_qs} HTTP/1.1\r\n", self._host_line]
        lines += [f"{k}: {v}\r\n" for k, v in headers]
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        elif chunked:
            lines.append("Transfer-Encoding: chunked\r\n")
        lines.append("\r\n")
        head = "".join(lines)
        # one CR and one LF per line: a header name or value carrying its own would split the
        # request (aiohttp refuses those too)
        if head.count("\n") != len(lines) or head.count("\r") != len(lines):
            raise UpstreamProtocolError(f"a header for {self.url} holds a line break", self.url)
        return head.encode("latin-1")

    async def send(
        self,
        request: UpstreamRequest,
        *,
        connect_s: float | None = None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse:
        t = self._timeouts
        headers, short = with_deadline(request, deadline_s, t.total)
        req = _Request(short if short is not None else t.total, t.read)
        connect = connect_s if connect_s is not None else t.connect
        try:
            conn = await self._acquire(connect)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{self.url} timed out during request", self.url) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.url}: {exc}", self.url) from exc
        try:
            await self._write(conn, request, headers, request.body, req)
            while not conn.headers_done:
                await conn.wait(req.next_wait())
            reason, fields = response_head(self.url, conn.reason, conn.headers)
            out = UpstreamResponse(conn.status, reason, fields, replica=self.url)
            if request.method == "HEAD" or conn.status in (204, 304):
                if not conn.done:  # the parser would wait for the body a HEAD answer announces
                    conn.keep_alive = False
                    conn.done = True
                out.body = conn.take()
                self._release(conn)
                return out
            if read_whole(conn.length, out.header("Content-Type") or ""):
                out.body = await self._whole_body(conn, req)
                self._release(conn)
            else:
                out.stream = _Stream(self, conn, req)
            return out
        except RequestBodyError:  # the client's body failed: not this replica's doing
            conn.close()
            self._release(conn)
            raise
        except Exception as exc:
            conn.close()
            self._release(conn)
            raise _translate(exc, self.url, "body" if conn.headers_done else "request") from exc
        except BaseException:  # cancelled: never back to the pool dirty
            conn.close()
            self._release(conn)
            raise

    async def _write(
        self,
        conn: H1Connection,
        request: UpstreamRequest,
        headers: list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        req: _Request,
    ) -> None:
        if body is None or isinstance(body, bytes):
            data = body or b""
            length = len(data) if data or request.method not in _NO_LENGTH_METHODS else None
            head = self._head(request, headers, length, chunked=False)
            conn.start(head + data if len(data) < 65536 else [head, data])
            return
        declared = next((v for k, v in headers if k.lower() == "content-length"), None)
        head = self._head(request, headers, None, chunked=declared is None)
        conn.start(head)
        async for chunk in body:
            if not chunk:
                continue
            conn.write(chunk if declared is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await conn.drain(req.next_wait())
            if conn.refuses_body:
                # writing on waited out the read timeout and hid the replica's answer behind a
                # 504; the request is cut short, so the connection ends with this answer
                conn.keep_alive = False
                return
        if declared is None:
            conn.write(b"0\r\n\r\n")

    async def _whole_body(self, conn: H1Connection, req: _Request) -> bytes:
        while not conn.done:
            await conn.wait(req.next_wait())
        return conn.take()

    def connections_in_use(self) -> int:
        return len(self._busy)

    def pool_stats(self) -> dict[str, int]:
        return {
            "idle": sum(1 for c in self._idle if not c.closed),
            "in_use": len(self._busy),
            "limit": self._limits.max_connections,
        }

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing before the loop moves on


class _Stream:
    """A streamed response body. Closing it early (or never reading it) closes the connection
    instead of returning it to the pool dirty; a body read to the end releases it for reuse."""

    def __init__(self, owner: LeanHttp1Transport, conn: H1Connection, req: _Request) -> None:
        self._owner = owner
        self._conn = conn
        self._req = req
        self._released = False

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        try:
            while not conn.has_body():
                if conn.done:
                    self._release()
                    raise StopAsyncIteration
                await conn.wait(self._req.next_wait())
            return conn.take()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            conn.close()
            self._release()
            raise _translate(exc, self._owner.url, "stream") from exc
        except BaseException:
            conn.close()
            self._release()
            raise

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self._conn)

    async def aclose(self) -> None:
        if not self._conn.done:
            self._conn.close()
        self._release()


def _translate(exc: Exception, replica: str, phase: str) -> UpstreamError:
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, ReadTimeout | TimeoutError):
        return UpstreamTimeout(f"{replica} timed out during {phase}", replica)
    if isinstance(exc, ConnectionClosed | ConnectionError):
        return UpstreamProtocolError(f"{replica} closed the connection during {phase}", replica)
    if isinstance(exc, BadResponse):
        return UpstreamProtocolError(f"{replica} sent a broken body during {phase}: {exc}", replica)
    return UpstreamProtocolError(f"{replica} failed during {phase}: {exc}", replica)
