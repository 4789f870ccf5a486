"""A replica's status reason and header fields as the gateway passes them on: refused when they
hold what no HTTP field may (a control character, DEL, a field name that is not a token), and
decoded so that writing them again gives the bytes the replica sent. Both HTTP/1.1 transports
use it; nothing here reads bodies.

aiohttp's response writer refuses control characters and DEL (ValueError mid-response: the
client saw its connection dropped while the entry was already cached, and the hit, written by
gateway/hit_response.py, replayed the bytes). Both writers encode a header as UTF-8, so a value
that is UTF-8 is kept as that text and leaves byte for byte. Other obs-text (a lone 0x80-0xff
byte, e.g. latin-1) cannot be written as sent by either: it is read as latin-1, HTTP's
historical charset, and so leaves in UTF-8, the same bytes on a miss and on every hit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from backends.errors import UpstreamProtocolError

# RFC 9110 5.6.2 token; 5.5 field-value: no CTL but HTAB (CR, LF and NUL among them), no DEL
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def field_text(raw: bytes) -> str:
    """A field value (or reason phrase) as text: UTF-8 when it is, else latin-1."""
    if raw.isascii():
        return raw.decode("ascii")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def response_head(
    replica: str, reason: bytes, fields: Iterable[tuple[bytes, bytes]]
) -> tuple[str, list[tuple[str, str]]]:
    """The reason and header fields as text, or UpstreamProtocolError (a 502, nothing cached)
    for a field the gateway could not write to its client. The offending bytes are not echoed."""
    if _CONTROL.search(reason) is not None:
        raise UpstreamProtocolError(
            f"{replica} sent a status line with a control character in its reason", replica
        )
    out = []
    for name, value in fields:
        if _TOKEN.fullmatch(name) is None:
            raise UpstreamProtocolError(
                f"{replica} sent a response header whose name is not an HTTP token", replica
            )
        if _CONTROL.search(value) is not None:
            raise UpstreamProtocolError(
                f"{replica} sent a response header ({name.decode('ascii')}) with a control "
                "character in its value",
                replica,
            )
        out.append((name.decode("ascii"), field_text(value)))
    return field_text(reason), out
