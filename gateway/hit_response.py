"""A cache hit written as one block of bytes: status line, the entry's headers serialised once
per entry and framing, the per-request headers, the body; one `transport.write`.

`web.Response` builds a CIMultiDict from the headers, works out framing, Date, Server and
Connection, then serialises it all again for every hit: about a fifth of a hit's CPU went there
for bytes that, but for X-Cache, Age, Server-Timing and Date, are the same every time.

aiohttp's request handler needs only `prepare`, `write_eof` and `keep_alive` from what a handler
returns (and the access log `status`, `body_length` and `headers`). It is used only where its
shortcuts are exact: HTTP/1.1, a keep-alive connection, not HEAD (`prefer`); every other hit
goes out through `web.Response`.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from multidict import CIMultiDict

from gateway.headers import SERVER

_SERVER = f"Server: {SERVER}\r\n"
_DROP = frozenset({"content-length", "transfer-encoding", "connection", "date", "server"})


def prefer(request: web.BaseRequest) -> bool:
    """Whether this request's hit can go out as one block (see the module docstring)."""
    return request.version == (1, 1) and request.keep_alive and request.method != "HEAD"


def header_block(headers: list[tuple[str, str]], body: bytes, status: int = 200) -> str:
    """The entry's own header lines with the framing this writer owns (computed once per entry
    and framing, memoised by the caller). A 204 has no framing at all (RFC 9110 8.6: no
    Content-Length), and no body."""
    lines = [f"{k}: {v}\r\n" for k, v in headers if k.lower() not in _DROP]
    if status != 204:
        lines.append(f"Content-Length: {len(body)}\r\n")
    return "".join(lines)


class HitResponse(web.StreamResponse):
    """A hit written in one piece: a StreamResponse to every caller (its status, headers and
    length read as usual), whose prepare writes the whole response at once."""

    def __init__(
        self, status: int, reason: str, block: str, extra: list[tuple[str, str]], body: bytes
    ) -> None:
        super().__init__(status=status, reason=reason)
        self._block = block
        self._extra = extra
        self._hit_body = body
        self._sent = 0
        self._writer: AbstractStreamWriter | None = None

    @property
    def keep_alive(self) -> bool:
        # `prefer` let only keep-alive requests here; force_close() (a drain) still ends it
        return self._keep_alive is not False

    @property
    def body_length(self) -> int:
        return self._sent  # as aiohttp counts it: status line and headers included

    @property
    def headers(self) -> CIMultiDict[str]:
        """For the access log only (rarely on): the headers as a mapping, built on demand."""
        out: CIMultiDict[str] = CIMultiDict()
        for line in self._block.split("\r\n"):
            name, sep, value = line.partition(": ")
            if sep:
                out.add(name, value)
        for name, value in self._extra:
            out.add(name, value)
        return out

    async def prepare(self, request: web.BaseRequest) -> None:
        transport = request.transport
        if transport is None or transport.is_closing():
            # as web.Response's write would: the handler treats it as an early disconnect
            raise ConnectionResetError("the client went away before its hit was written")
        extra = "".join([f"{k}: {v}\r\n" for k, v in self._extra])
        if not self.keep_alive:
            extra += "Connection: close\r\n"
        head = (
            f"HTTP/1.1 {self.status} {self.reason}\r\n{self._block}{extra}"
            f"Date: {rfc822_formatted_time()}\r\n{_SERVER}\r\n"
        )
        # UTF-8, as aiohttp's writer encodes every other response's headers: a miss and its
        # hits send a non-ASCII value as the same bytes (backends' response_head.field_text)
        data = head.encode() + (self._hit_body if self.status != 204 else b"")
        self._sent = len(data)
        transport.write(data)
        self._writer = request._payload_writer

    async def write_eof(self, data: bytes = b"") -> None:
        """prepare wrote everything; wait, as web.Response does, until the connection's send
        buffer is back under its high-water mark. Without it a client that pipelined requests
        for a large entry and read nothing had every answer buffered here at once (100 of a
        4 MB entry: 400 MB), as the handler moved on to the next request at once."""
        if self._writer is not None:
            await self._writer.drain()
