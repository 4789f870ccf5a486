"""Cached entries rendered back into HTTP: the framing a request asked for (SSE or one JSON
body, with or without the usage chunk), converted once per entry and framing and memoised on
the entry; the headers an entry may replay.
"""

from __future__ import annotations

from typing import cast

from aiohttp import web

from cache.codec import CacheEntry
from gateway.headers import downstream_headers
from gateway.protocols import openai_sse
from gateway.protocols.base import Call
from gateway.protocols.stream_codecs import convertible

# Never replayed from an entry: per-response facts, or what we set ourselves on the way out.
_NOT_KEPT = frozenset(
    {
        "date",
        "server",
        "set-cookie",
        "age",
        "x-cache",
        "server-timing",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
    }
)
SSE = "text/event-stream"

Rendered = tuple[bytes, list[tuple[str, str]]]
Framing = tuple[bool, bool]


def kept_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in downstream_headers(headers) if k.lower() not in _NOT_KEPT]


def _content_type(entry: CacheEntry) -> str:
    for k, v in entry.headers:
        if k.lower() == "content-type":
            return v
    return ""


def framing_of(call: Call) -> Framing:
    """What a response's shape depends on beyond the entry: stream or not, usage chunk or not."""
    return (call.stream, bool(call.extra.get("include_usage")))


def render(
    entry: CacheEntry, framing: Framing, x_cache: str, server_timing: str
) -> web.Response | None:
    """The entry in the framing the request asked for; None when it cannot be converted."""
    rendered = entry.memo.get(framing)
    if rendered is None:
        rendered = entry.memo[framing] = _render(entry, *framing) or False
    if rendered is False:
        return None
    body, base = cast(Rendered, rendered)
    # a plain list: web.Response builds its own CIMultiDict from it (building one here doubles it)
    headers = [
        *base,
        ("X-Cache", x_cache),
        ("Age", str(int(entry.age()))),
        ("Server-Timing", server_timing),
    ]
    return web.Response(status=entry.status, headers=headers, body=body)


def _render(entry: CacheEntry, stream: bool, include_usage: bool) -> Rendered | None:
    """Body and headers of the entry in the call's framing (computed once per entry and framing)."""
    body: bytes | None
    ctype: str | None = None
    codec = convertible(entry.kind)  # per kind: openai_sse for chat/completions, anthropic_sse
    if entry.events is not None:
        if stream or codec is None:
            body = openai_sse.join_events(entry.events)
        else:
            body, ctype = codec.events_to_body(entry.events, entry.kind), "application/json"
    else:
        body = entry.body
        if stream and codec is not None and "json" in _content_type(entry):
            assert entry.body is not None
            events = codec.body_to_events(entry.body, entry.kind, include_usage)
            body, ctype = (openai_sse.join_events(events) if events else None), SSE
    if body is None:
        return None
    headers = entry.headers
    if ctype is not None:
        drop = {"content-type", "cache-control"}
        headers = [(k, v) for k, v in headers if k.lower() not in drop]
        headers.append(("Content-Type", ctype))
        if ctype == SSE:
            headers.append(("Cache-Control", "no-cache"))
    return body, headers
