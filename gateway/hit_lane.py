"""The exact hit's lane: request bytes seen before, whose answer is in L1, are answered before the
pipeline sets anything up, without parsing.

The pipeline pins a runtime generation, counts the request in flight and resolves it through
three coroutine layers; a hit never awaits, so none of that can change its answer, and it was
about a third of a hit's own CPU. (The tracing span is opened first, for a hit too.) This is the
only place a request's bytes are looked up by alias. The lane checks what the long way would
(one route, exact cache on, the body already in the buffer, within the size limit, no cache
directives), looks the alias up (cache/alias.py) and, on a miss, hands the body it took and the
alias it computed to the long way (`Early`), so neither is done twice.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from cache import (
    ALIAS_MAX_BODY,
    CACHED_METHODS,
    CONDITIONAL_HEADERS,
    AliasKey,
    CacheFlow,
    Flows,
    Hit,
)
from gateway import responses
from gateway.codings import body_decoder, coding_error
from gateway.config import LimitSettings
from gateway.headers import nominated
from gateway.metrics import Metrics
from gateway.protocols.base import KEYED_HEADERS
from gateway.render import Framing
from gateway.routing import Router
from gateway.timing import Timing


@dataclass(frozen=True, slots=True)
class Early:
    """What the lane took from a request it could not answer: the body, and its alias key
    (None when it did not look one up)."""

    body: bytes
    alias: AliasKey | None


def answer(
    request: web.Request,
    timing: Timing,
    router: Router,
    flows: Flows,
    limits: LimitSettings,
    metrics: Metrics,
) -> web.StreamResponse | Early | None:
    """The hit; else the body and alias for the long way; None when the lane did not look."""
    content = request.content
    length = request.content_length
    if not content.is_eof() or (length is not None and length > limits.max_body_bytes):
        return None
    headers = request.headers
    if (
        ("Content-Encoding" in headers or "Transfer-Encoding" in headers)
        and request.body_exists
        and (coding_error(headers) or body_decoder(request, limits.max_body_bytes) is not None)
    ):
        return None  # a coded body: the long way decodes it, or refuses it
    candidates, _ = router.resolve(request.method, request.path)
    if len(candidates) != 1 or not candidates[0].policy.exact.enabled:
        return None
    route = candidates[0]
    flow = flows.get(route.name)
    if flow is None:
        return None
    try:
        body = content.read_nowait()
    except RequestPayloadError:
        return None  # a body that does not decode: the long way says so to the client
    headers = request.headers
    if (
        len(body) > ALIAS_MAX_BODY
        or request.method not in CACHED_METHODS  # an unsafe method is never answered stored
        or "Cache-Control" in headers  # cache directives take the long way
        or "Pragma" in headers
        or any(h in headers for h in CONDITIONAL_HEADERS)  # ... and so do ranges, preconditions
        or nominated(headers)  # headers the upstream will not get: the key must not read them
    ):
        return Early(body, None)
    alias = alias_of(request, flow, body)
    hit = fast_hit(request, flow, alias, timing)
    if hit is None:
        return Early(body, alias)
    metrics.observe_request(
        route.name, route.backend, hit.status, time.perf_counter() - timing.start
    )
    return hit


def alias_of(request: web.Request, flow: CacheFlow, body: bytes) -> AliasKey:
    # with the headers an adapter keys on (same bytes, other anthropic-version: another key)
    tenant = flow.tenant(request.headers, KEYED_HEADERS)
    return (
        flow.route,
        request.method,
        request.raw_path,  # as sent (finer than path_qs, and no URL built per request)
        request.headers.get("Content-Type", ""),
        request.headers.get("Inference-Header-Content-Length", ""),
        # hashed: even this in-process map never holds a credential in clear
        hashlib.blake2b(tenant.encode()).digest(),
        body,
    )


def fast_hit(
    request: web.Request, flow: CacheFlow, alias: AliasKey, timing: Timing
) -> web.StreamResponse | None:
    """An L1 hit for bytes seen before, without parsing; None sends the request the long way."""
    found = flow.fast_hit(alias)
    if found is None:
        return None
    entry, framing = found
    t = timing.add("parse", timing.start)  # the alias lookup stands in for parsing
    timing.add("cache", t)
    assert isinstance(framing, Framing)  # what the long way remembered
    return responses.cached(request, Hit(entry, "hit"), framing, timing)
