"""Request body codings: which ones the gateway decodes, the decoding, and a 415 for the others.

The gateway decodes a request body whose Content-Encoding is one header line naming one coding
it knows (gzip, deflate; br with Brotli; zstd with Python 3.14's compression.zstd or
backports.zstd: dependencies of this project), the same set aiohttp's server would decode, and
takes any other body as it came, even "gzip, identity" or a gzip line beside an identity one.
What goes upstream is the decoded body without the label (gateway.headers.upstream), so a body
in a coding it did not decode, or in a chain of codings ("gzip, br"), would reach the replica
still encoded and labelled as plain: refused instead, as RFC 9110 15.5.16 says, with the codings
it does take.

The gateway's server runs with aiohttp's decoding off (SERVER_OPTIONS) and decodes here
(BodyDecoder): aiohttp checks only a deflate stream for its end, so a gzip, br or zstd body cut
short was decoded as far as it went and forwarded as if whole. Here every coding must end where
the body ends, and the decoded size is held to limits.max_body_bytes as it grows (a small bomb
is refused after max_body_bytes of output, not inflated whole).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping
from typing import Any

from aiohttp import compression_utils, web
from aiohttp.web_protocol import RequestPayloadError

from gateway.errors import (
    BadRequest,
    GatewayError,
    NotImplementedCoding,
    PayloadTooLarge,
    UnsupportedMediaType,
)

DECODED = (
    ("gzip", "deflate")
    + (("br",) if getattr(compression_utils, "HAS_BROTLI", False) else ())
    + (("zstd",) if getattr(compression_utils, "HAS_ZSTD", False) else ())
)
_PLAIN = frozenset({"", "identity"})
# A gzip or zstd body may hold several members, each with its decompressor: at most one per
# this many bytes of limits.max_body_bytes (4096 in the default 16 MiB), and never fewer than
# _MIN_MEMBERS; and a member is offered its input _FIRST_OFFER bytes first, then twice as many
# each step until it ends (BodyDecoder.feed).
_BYTES_PER_MEMBER = 4096
_MIN_MEMBERS = 64
_FIRST_OFFER = 1024
# aiohttp runner options for the gateway's listeners: request bodies reach it as sent
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}


def coding_error(headers: Mapping[str, str]) -> GatewayError | None:
    """The 415 for a request body in a coding the server did not decode, the 501 for a transfer
    coding besides chunked (aiohttp reads "gzip, chunked" as chunked and passes the body on
    still compressed, its label gone with the hop-by-hop header), or None."""
    if "Transfer-Encoding" in headers:
        getall = getattr(headers, "getall", None)
        lines = (
            getall("Transfer-Encoding") if getall is not None else [headers["Transfer-Encoding"]]
        )
        extra = [
            c
            for c in (c.strip(" \t").lower() for v in lines for c in v.split(","))
            if c not in ("chunked", "")
        ]
        if extra:
            return NotImplementedCoding(
                f"request Transfer-Encoding {', '.join(extra)!r} is not supported: send the "
                "body chunked or with a Content-Length (a Content-Encoding may compress it)"
            )
    raw = headers.get("Content-Encoding")
    if raw is None:
        return None
    getall = getattr(headers, "getall", None)
    values = getall("Content-Encoding") if getall is not None else [raw]
    # exactly what aiohttp decodes: one line, one coding (its value stripped of spaces and tabs
    # by the parser, compared in ASCII lower case)
    if len(values) == 1 and values[0].isascii() and values[0].lower() in DECODED:
        return None
    codings = [c.strip(" \t").lower() for v in values for c in v.split(",")]
    if all(c in _PLAIN for c in codings):
        return None  # no coding at all: the body is plain
    codings = [c for c in codings if c not in _PLAIN]
    return UnsupportedMediaType(
        f"request Content-Encoding {', '.join(codings)!r} is not supported: send the body "
        f"plain or in one of {', '.join(DECODED)}",
        headers={"Accept-Encoding": ", ".join(DECODED)},
    )


async def read_body(request: web.Request) -> bytes:
    """The body of a request the gateway reads itself (admin calls): as aiohttp decoded it, or
    the 415 for a coding it did not (a gzip body is not JSON, and must not be read as if it
    were); one over limits.max_body_bytes (as sent, or once decoded) is the JSON 413."""
    if request.body_exists and (refused := coding_error(request.headers)) is not None:
        raise refused
    decoder = body_decoder(request, request.client_max_size)
    try:
        if decoder is not None:
            return await read_coded(request, decoder)
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds {request.client_max_size} bytes") from None
    except RequestPayloadError as exc:
        raise undecodable(request) from exc


async def read_coded(request: web.BaseRequest, decoder: BodyDecoder) -> bytes:
    """A coded body read through its decoder as it arrives: the 413 comes as soon as the output
    (or the coded input) passes the limit, not once the whole body is in."""
    content = request.content
    if content.is_eof():
        return decoder.whole(content.read_nowait())
    parts = []
    async for chunk in content.iter_any():
        if decoder.seen + len(chunk) > decoder.limit:
            raise PayloadTooLarge(f"request body exceeds {decoder.limit} bytes")
        parts.append(decoder.feed(chunk))
    decoder.finish()
    return b"".join(parts)


def undecodable(request: web.Request) -> BadRequest:
    """aiohttp decodes gzip/deflate request bodies as they arrive; one that does not decode is
    the client's error, said as such (not a 500 with the connection dropped)."""
    return BadRequest(undecodable_message(request.headers.get("Content-Encoding", "")))


def undecodable_message(coding: str) -> str:
    """What a client is told of a body that does not decode as `coding` ("": unknown)."""
    if coding:
        return f"the request body does not decode as its Content-Encoding ({coding}) says"
    return "the request body could not be read"


def body_decoder(request: web.BaseRequest, limit: int) -> BodyDecoder | None:
    """The decoder a request's body needs before the gateway reads it, or None: no coding, or
    one the server decoded already (an app run under a runner with aiohttp's decoding on).
    Call after coding_error, which refuses the codings no decoder here takes."""
    coding = request.headers.get("Content-Encoding")
    if coding is None or not request.body_exists:
        return None  # (a request without a body has an EmptyStreamReader: nothing to decode)
    if request.content.total_compressed_bytes is not None:
        return None
    coding = coding.strip(" \t").lower()
    if coding in _PLAIN or coding not in DECODED:
        return None
    return BodyDecoder(coding, limit)


@functools.cache
def _zstd() -> Any:
    """compression.zstd (3.14) or backports.zstd, looked up once: a failed import is not
    remembered, so trying the first on every zstd member searched sys.path each time (~100 us)."""
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]
    return zstd


class BodyDecoder:
    """One request body's Content-Encoding undone as its bytes arrive. `feed` returns what each
    chunk decodes to and raises the JSON 413 once the output passes `limit` (before inflating
    any further); `finish` raises the 400 unless the coded stream ended exactly where the body
    did. A gzip or zstd body may hold several members, one after another (RFC 1952 2.2)."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self.room = limit
        self.limit = limit
        self.seen = 0  # coded bytes fed
        self._d: Any = None  # the current member's decompressor (made on the first byte)
        self._ended = False  # the current member's stream ended
        self._errors: tuple[type[Exception], ...] = (zlib.error,)  # what its decompressor raises
        # Each member costs a decompressor (a zstd one ~20 us) and decodes on the event loop:
        # a body of empty members (20 bytes of gzip, 9 of zstd) is bounded by its count.
        self.members = 0
        self.max_members = max(_MIN_MEMBERS, limit // _BYTES_PER_MEMBER)
        self._offer = _FIRST_OFFER  # input offered to the current member per step

    def whole(self, raw: bytes) -> bytes:
        """A body that arrived whole, decoded and checked."""
        out = self.feed(raw)
        self.finish()
        return out

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        self.seen += len(chunk)
        parts: list[bytes] = []
        data = memoryview(chunk)
        at = 0
        try:
            while at < len(data):
                if self._d is None or self._ended:
                    if self._ended and self.coding not in ("gzip", "zstd"):
                        raise ValueError("data after the end of the coded stream")
                    self.members += 1
                    if self.members > self.max_members:
                        raise PayloadTooLarge(
                            f"request body holds more than {self.max_members} {self.coding} "
                            f"members (one per {_BYTES_PER_MEMBER} bytes of the "
                            f"{self.limit}-byte limit)"
                        )
                    self._d = self._new(data[at : at + 1])
                    self._ended = False
                    self._offer = _FIRST_OFFER
                # A member gets its input a slice at a time, each twice the last: what follows
                # its end comes back as a copy (unused_data), so offering it the whole rest of
                # the chunk made a body of many small members quadratic (a 2 MiB zstd body of
                # empty frames held the event loop for 30 s).
                piece = data[at : at + self._offer] if self.coding != "br" else data[at:]
                out, used = self._step(piece)
                parts.append(out)
                at += used
                if not self._ended:
                    self._offer *= 2
        except (zlib.error, ValueError, EOFError) as exc:
            raise BadRequest(undecodable_message(self.coding)) from exc
        return b"".join(parts)

    def finish(self) -> None:
        if self.seen and not self._ended:
            raise BadRequest(undecodable_message(self.coding))

    def _new(self, first: memoryview) -> Any:
        if self.coding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self.coding == "deflate":
            # RFC 9110 says zlib-wrapped; raw deflate is sent often enough that aiohttp takes it
            # too (its first byte's low nibble is not 8, the zlib CM field): so does this
            raw = first[0] & 0x0F != 8
            return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
        if self.coding == "br":
            import brotli  # (the Brotli package, a dependency; imported where it is used)

            self._errors = (brotli.error,)
            return brotli.Decompressor()
        zstd = _zstd()
        self._errors = (zstd.ZstdError,)
        return zstd.ZstdDecompressor()

    def _step(self, data: memoryview) -> tuple[bytes, int]:
        """Decode as much of `data` as the room allows: (output, input bytes it took; the rest
        is a next member's)."""
        d = self._d
        try:
            if self.coding == "br":
                out: bytes = d.process(data, output_buffer_limit=self.room + 1)
                self._take(out)
                self._ended = d.is_finished()
                return out, len(data)
            out = d.decompress(data, self.room + 1)  # zlib and zstd: at most that many bytes
        except self._errors as exc:
            raise ValueError(str(exc)) from exc
        self._take(out)
        self._ended = d.eof
        return out, len(data) - len(d.unused_data) if d.eof else len(data)

    def _take(self, out: bytes) -> None:
        if len(out) > self.room:
            raise PayloadTooLarge(f"request body exceeds {self.limit} bytes once decoded")
        self.room -= len(out)
