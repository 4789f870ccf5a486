"""The stored answer to a GET of a request's target, for requests of another method on it.

- RFC 9111 4.4: an unsafe request that succeeded drops it, so the next GET asks the upstream
  again (`invalidate_get`).
- RFC 9111 4 / RFC 9110 9.3.2: a HEAD is answered from it, the GET's status and header fields
  without its body (`stored_get`). Before, every HEAD went upstream (`X-Cache: bypass`).
- RFC 9111 4.3.2: a GET or HEAD whose If-None-Match names its ETag gets a 304 from it, and one
  that names another tag gets it whole (`stored_answer`). Before, each went upstream.
"""

from __future__ import annotations

from aiohttp import web

from cache import (
    CacheFlow,
    CacheKey,
    Flows,
    Hit,
    RequestDirectives,
    evaluated_here,
    not_modified,
    request_directives,
)
from gateway import responses
from gateway.headers import field
from gateway.protocols.base import Call
from gateway.render import Framing, framing_of
from gateway.routing import Router
from gateway.timing import Timing


def get_of(
    router: Router, flows: Flows, request: web.Request
) -> tuple[CacheFlow, Call, CacheKey] | None:
    """A GET of this request's target, keyed exactly as that GET is: the route a GET of this
    path resolves to, its adapter, this request's tenant. Only where that route is a cached
    passthrough one, which keys a bodiless GET by method, raw path and query alone."""
    candidates, _ = router.resolve("GET", request.path)
    if len(candidates) != 1:
        return None
    route = candidates[0]
    flow = flows.get(route.name)
    if route.protocol != "passthrough" or not route.policy.exact.enabled or flow is None:
        return None
    call = route.adapter.parse(
        "GET",
        request.raw_path.partition("?")[0],
        request.raw_path.partition("?")[2],  # as the GET keys it: the query as sent
        "",
        b"",
        request.headers,
    )
    if call is None:
        return None
    return flow, call, flow.key(call.model, call.key_fields, request.headers)


async def invalidate_get(router: Router, flows: Flows, request: web.Request) -> None:
    """Drop it here and in Redis. The other processes on the same Redis drop it through the
    purge fan-out (RouteCache.invalidate); without Redis, the sibling workers of `--workers N`
    are told over their private sockets (gateway.worker_drops)."""
    found = get_of(router, flows, request)
    if found is not None:
        flow, _, key = found
        await flow.rc.invalidate(key)


async def stored_get(
    router: Router, flows: Flows, request: web.Request, directives: RequestDirectives
) -> tuple[Hit, Framing] | None:
    """The stored GET a HEAD may be answered with, under the HEAD's own Cache-Control (max-age,
    min-fresh, no-cache); None: the HEAD goes upstream, and its answer is not stored (it has no
    body to serve a GET with)."""
    found = get_of(router, flows, request) if directives.lookup else None
    if found is None:
        return None
    flow, call, key = found
    entry = flow.rc.lookup_l1(key, directives)
    if entry is None:
        looked = await flow.rc.lookup(key, directives)
        entry = looked[0] if looked is not None else None
    framing = framing_of(call)
    if entry is None or not framing.serves(entry):
        return None
    return Hit(entry, "hit"), framing


async def stored_answer(
    router: Router, flows: Flows, request: web.Request, conditional: bool, timing: Timing
) -> web.StreamResponse | None:
    """A HEAD without preconditions, or a GET or HEAD whose only one is If-None-Match, answered
    from the stored GET of its target (under the request's own Cache-Control): a 304 when
    If-None-Match names that answer's ETag (or is `*`), else the answer itself (the condition
    is true: the upstream would send it whole). None: the request goes on, upstream."""
    headers = request.headers
    revalidates = conditional and evaluated_here(request.method, headers)
    if not revalidates and (conditional or request.method != "HEAD"):
        return None
    cc, pragma = field(headers, "Cache-Control"), field(headers, "Pragma")
    found = await stored_get(router, flows, request, request_directives(cc, pragma))
    if found is None:
        return None
    hit, framing = found
    inm = field(headers, "If-None-Match")
    if revalidates and inm is not None and hit.entry.status == 200:
        etag = next((v for k, v in hit.entry.headers if k.lower() == "etag"), None)
        if not_modified(inm, etag):
            return responses.not_modified(hit, timing)
    return responses.cached(request, hit, framing, timing)
