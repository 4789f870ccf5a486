"""Request body codings: which ones the gateway decodes, and a 415 for the others.

aiohttp's server decodes a request body whose Content-Encoding is one header line naming one
coding it knows (gzip, deflate; br with Brotli; zstd with Python 3.14's compression.zstd or
backports.zstd: dependencies of this project) and passes any other body through as it came,
even "gzip, identity" or a gzip line beside an identity one. What goes upstream
is the decoded body without the label (gateway.headers.upstream), so a body in a coding it did
not decode, or in a chain of codings ("gzip, br"), would reach the replica still encoded and
labelled as plain: refused instead, as RFC 9110 15.5.16 says, with the codings it does take.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds {request.client_max_size} bytes") from None
    except RequestPayloadError as exc:
        raise undecodable(request) from exc


def undecodable(request: web.Request) -> BadRequest:
    """aiohttp decodes gzip/deflate request bodies as they arrive; one that does not decode is
    the client's error, said as such (not a 500 with the connection dropped)."""
    return BadRequest(undecodable_message(request.headers.get("Content-Encoding", "")))


def undecodable_message(coding: str) -> str:
    """What a client is told of a body that does not decode as `coding` ("": unknown)."""
    if coding:
        return f"the request body does not decode as its Content-Encoding ({coding}) says"
    return "the request body could not be read"
