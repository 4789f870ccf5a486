"""RFC 9111 4.4: an unsafe request that succeeded drops the stored answer to a GET of its
target, so the next GET asks the upstream again."""

from __future__ import annotations

from aiohttp import web

from cache import Flows
from gateway.routing import Router


async def invalidate_get(router: Router, flows: Flows, request: web.Request) -> None:
    """Drop the stored answer to a GET of this request's target, keyed exactly as that GET is:
    the route a GET of this path resolves to, its adapter, this request's tenant. Only where
    that route is a cached passthrough one, which keys a bodiless GET by method, raw path and
    query alone. The other processes on the same Redis drop it through the purge fan-out
    (RouteCache.invalidate); without Redis, the sibling workers of `--workers N` are told over
    their private sockets (gateway.worker_drops)."""
    candidates, _ = router.resolve("GET", request.path)
    if len(candidates) != 1:
        return
    route = candidates[0]
    flow = flows.get(route.name)
    if route.protocol != "passthrough" or not route.policy.exact.enabled or flow is None:
        return
    call = route.adapter.parse(
        "GET",
        request.raw_path.partition("?")[0],
        request.query_string,
        "",
        b"",
        request.headers,
    )
    if call is not None:
        await flow.rc.invalidate(flow.key(call.model, call.key_fields, request.headers))
