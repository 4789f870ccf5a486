"""Request body codings: which ones the gateway decodes, and a 415 for the others.

aiohttp's server decodes a request body whose Content-Encoding is one coding it knows (gzip,
deflate; br with brotli; zstd with Python 3.14's compression.zstd or backports.zstd, both
dependencies of this project) and passes any other body through as it came. What goes upstream
is the decoded body without the label (gateway.headers.upstream), so a body in a coding it did
not decode, or in a chain of codings ("gzip, br"), would reach the replica still encoded and
labelled as plain: refused instead, as RFC 9110 15.5.16 says, with the codings it does take.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD

from gateway.errors import UnsupportedMediaType

DECODED = ("gzip", "deflate") + (("br",) if HAS_BROTLI else ()) + (("zstd",) if HAS_ZSTD else ())
_PLAIN = frozenset({"", "identity"})


def coding_error(headers: Mapping[str, str]) -> UnsupportedMediaType | None:
    """The 415 for a request body in a coding the server did not decode, or None."""
    raw = headers.get("Content-Encoding")
    if raw is None:
        return None
    getall = getattr(headers, "getall", None)
    values = getall("Content-Encoding") if getall is not None else [raw]
    codings = [c.strip().lower() for v in values for c in v.split(",")]
    codings = [c for c in codings if c not in _PLAIN]
    if not codings or (len(codings) == 1 and codings[0] in DECODED):
        return None
    return UnsupportedMediaType(
        f"request Content-Encoding {', '.join(codings)!r} is not supported: send the body "
        f"plain or in one of {', '.join(DECODED)}",
        headers={"Accept-Encoding": ", ".join(DECODED)},
    )
