"""Every response the gateway writes: answers from the cache, the backend's answers (whole,
streamed, or recorded for the cache while they stream), and the gateway's own errors.

One writer, so the rules hold everywhere: the gateway's headers (X-Cache, Age, Server-Timing)
replace any the upstream sent; hop-by-hop headers never cross; a stream that breaks after its
headers went out ends in the route's error event (OpenAI, Anthropic) and is cut before the
terminating chunk, so the client sees an error rather than a silently truncated body; a client
that goes away mid-stream (or while the gateway drains) ends the write quietly, while a
recording still reads on for the flight's waiters and the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus

from aiohttp import web

from backends import UpstreamError, UpstreamResponse
from cache import Fresh, Hit, Recording, StreamCut
from gateway.errors import GatewayError, error_body, stream_error_event
from gateway.headers import downstream_headers
from gateway.hit_response import HitResponse, header_block, prefer
from gateway.protocols.v2 import reply_with_id
from gateway.render import Framing, rendered, repadded
from gateway.timing import Timing

log = logging.getLogger("latentgate.responses")

# what the gateway says of its cache, never taken from an upstream (an upstream's Age passes:
# a fresh answer's age is the one it arrived with)
_OURS = frozenset({"x-cache", "x-cache-bypass-reason", "x-cache-semantic-skip"})
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_BLOCK = "hit-header-block"  # the entry memo's key for its serialised headers, per framing
# How long a cut stream's error event may wait on a client that is not reading (it is then
# closed without it: a chunked client still sees the cut)
_LAST_WORDS_S = 1.0


Reply = tuple[bytes, list[tuple[str, str]]]


def with_request_id(hit: Hit, framing: Framing, request_id: str | None) -> Reply | None:
    """A v2 hit's body and headers echoing this request's id (the key leaves ids out), or None
    when the entry, as stored, already carries it."""
    out = rendered(hit.entry, framing)
    assert out is not None, "the flow serves only entries this framing renders"
    return reply_with_id(out[0], list(out[1]), request_id)


def cached(
    request: web.BaseRequest,
    hit: Hit,
    framing: Framing,
    timing: Timing,
    reply: Reply | None = None,
) -> web.StreamResponse:
    """A cache entry in the request's framing (the flow only returns hits that render).
    reply: this request's own version of the entry's body and headers (a v2 id), if any."""
    if reply is None:
        reply = repadded(hit.entry, framing)  # (its own obfuscation padding, if any)
    out = rendered(hit.entry, framing)
    assert out is not None, "the flow serves only entries this framing renders"
    body, base = out if reply is None else reply
    shared = reply is None  # the entry's own bytes: its header block is memoised per framing
    extra = [
        ("X-Cache", hit.x_cache),
        ("Age", str(int(hit.entry.age()))),
        ("Server-Timing", timing.header()),
    ]
    if hit.semantic is not None:
        extra.append(("X-Cache-Similarity", f"{hit.semantic.similarity:.4f}"))
        extra.append(("X-Cache-Score", f"{hit.semantic.score:.4f}"))
        extra.append(("X-Cache-Entry", hit.semantic.exact_key))
    status = hit.entry.status
    if status in _REASONS and prefer(request):
        memo = hit.entry.memo
        block = memo.get((_BLOCK, framing)) if shared else header_block(base, body, status)
        if block is None:
            block = memo[(_BLOCK, framing)] = header_block(base, body, status)
        assert isinstance(block, str)
        return HitResponse(status, _REASONS[status], block, extra, body)
    # a plain list: web.Response builds its own CIMultiDict from it (building one here doubles it)
    # (entries stored before the upstream's Server was dropped may still hold it)
    kept = [(k, v) for k, v in base if k.lower() != "server"]
    return web.Response(status=status, headers=[*kept, *extra], body=body)


# What a 304 carries of the stored 200 it stands for (RFC 9110 15.4.5; Date is the writer's)
_VALIDATOR_FIELDS = frozenset({"cache-control", "content-location", "etag", "expires", "vary"})


def not_modified(hit: Hit, timing: Timing) -> web.Response:
    """A 304 for a conditional request whose If-None-Match names the entry's ETag: no body, the
    header fields a 200 would have sent that describe it, and the cache's own (X-Cache, Age)."""
    kept = [(k, v) for k, v in hit.entry.headers if k.lower() in _VALIDATOR_FIELDS]
    extra = [
        ("X-Cache", hit.x_cache),
        ("Age", str(int(hit.entry.age()))),
        ("Server-Timing", timing.header()),
    ]
    return web.Response(status=304, headers=[*kept, *extra])


async def fresh(
    request: web.Request,
    answer: Fresh,
    timing: Timing,
    on_cut: Callable[[], None],
    protocol: str = "",
) -> web.StreamResponse:
    """The backend's answer to a cached route's request, with its X-Cache (and, on a bypass,
    X-Cache-Bypass-Reason: sampled, no-store, no-cache or conditional)."""
    return await upstream(
        request,
        answer.response,
        timing,
        on_cut,
        protocol=protocol,
        x_cache=answer.x_cache,
        reason=answer.reason,
        semantic_skip=answer.semantic_skip,
        recording=answer.recording,
    )


async def upstream(
    request: web.Request,
    up: UpstreamResponse,
    timing: Timing,
    on_cut: Callable[[], None],
    *,
    x_cache: str | None = None,
    reason: str = "",
    semantic_skip: str = "",
    recording: Recording | None = None,
    protocol: str = "",
) -> web.StreamResponse:
    """protocol: the route's, whose error event ends an event stream cut mid-way."""
    headers = downstream_headers(up.headers)
    if x_cache is not None:
        headers = [(k, v) for k, v in headers if k.lower() not in _OURS]
        headers.append(("X-Cache", x_cache))
        if reason:
            headers.append(("X-Cache-Bypass-Reason", reason))
        if semantic_skip:
            headers.append(("X-Cache-Semantic-Skip", semantic_skip))
    headers.append(("Server-Timing", timing.header()))
    if request.method == "HEAD":
        # No body, but the size the GET would have: the upstream's Content-Length stands.
        length = up.header("Content-Length")
        if length is not None and length.isdigit():
            headers.append(("Content-Length", length))
        if up.stream is not None:
            await up.stream.aclose()  # type: ignore[attr-defined]  # hands the connection back
        return web.Response(status=up.status, reason=up.reason, headers=headers)
    if up.body is not None or up.stream is None:
        return web.Response(status=up.status, reason=up.reason, headers=headers, body=up.body)
    resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
    length = up.header("Content-Length")
    if length is not None and length.isdigit():
        resp.content_length = int(length)
    if recording is not None:
        recording.on_cut = on_cut  # (before the loop runs again: the pump has not stepped)
    chunks: AsyncIterator[bytes] = recording.chunks() if recording is not None else up.stream
    client_ok = True
    try:
        # The route's total bounds the whole exchange: a client that stops reading (its
        # writes block) does not hold the replica's stream, pool connection and in-flight
        # slot past it.
        async with asyncio.timeout(None if up.deadline is None else up.deadline - time.monotonic()):
            await resp.prepare(request)
            async for chunk in chunks:
                if client_ok:
                    try:
                        await resp.write(chunk)
                    except ConnectionError:
                        client_ok = False
                if not client_ok:
                    break  # nobody left to serve (a recording reads on by itself if wanted)
            if client_ok:
                await resp.write_eof()
    except (UpstreamError, TimeoutError) as exc:
        why = str(exc) or "past the route's total timeout"
        if not isinstance(exc, StreamCut):  # (a recording's cut is logged and counted by it)
            log.warning("upstream stream cut mid-way: %s", why)
            on_cut()
        if _ends_in_words(resp, client_ok):
            await _last_words(resp, stream_error_event(protocol, f"stream cut mid-way: {why}"))
        if request.transport is not None:
            request.transport.close()
    except ConnectionError:
        pass  # the client went away as the last bytes went out (e.g. during a drain)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        if recording is not None:
            await recording.close()
    return resp


def _ends_in_words(resp: web.StreamResponse, client_ok: bool) -> bool:
    """Does a cut stream get the error event? An event stream still going out, whose body's
    end the connection's close or the chunked framing marks. Not one with a Content-Length:
    aiohttp cuts a write to what the length has left, so the event filled it and the client
    read every byte promised, a whole body, its last event cut short (which the SDK drops)."""
    return (
        client_ok
        and resp.prepared
        and resp.content_length is None
        and "text/event-stream" in (resp.content_type or "")
    )


async def _last_words(resp: web.StreamResponse, event: bytes | None) -> None:
    """The cut stream's error event, if the client takes it at once; the connection is closed
    after it either way (no terminating chunk)."""
    if event is not None:
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(_LAST_WORDS_S):
                await resp.write(event)


def error(protocol: str, err: GatewayError, timing: Timing) -> web.Response:
    """The gateway's own error, in the envelope the route's clients parse."""
    headers = {
        "Content-Type": "application/json",
        "Server-Timing": timing.header(),
        **err.headers,
    }
    return web.Response(status=err.status, body=error_body(protocol, err), headers=headers)
