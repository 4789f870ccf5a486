"""While the gateway drains (SIGTERM) its listeners stay open: the probes keep answering (/readyz
says 503, so load balancers stop sending), and every new request for the routes gets 503 with
Retry-After and a closed connection, so clients retry elsewhere. In-flight requests finish.

A wrapper on the catch-all route rather than a middleware: the probes and the admin API need no
check, and model traffic pays one attribute read, not a middleware frame.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.state import AppState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CATCH_ALL = "/{tail:.*}"  # the route every model call takes (gateway/app.py)
# Its resource as registered: the dispatch shortcut recognises it by identity (aiohttp's
# `canonical` for it is "/{tail}", not the pattern, and a string compare once turned it off).
CATCH_ALL_RESOURCE = web.AppKey("catch_all_resource", web.AbstractResource)

_BODY = json.dumps(
    {
        "error": {
            "message": "the gateway is shutting down; retry on another instance",
            "type": "unavailable",
            "param": None,
            "code": 503,
        }
    }
).encode()


def turned_away() -> web.Response:
    resp = web.Response(
        status=503, body=_BODY, content_type="application/json", headers={"Retry-After": "1"}
    )
    resp.force_close()
    return resp


def unless_draining(state: AppState, handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if state.draining:
            # counted like any answer, under the route it would have taken: a rollout's 503s
            # belong in the dashboard's error ratio
            candidates, _ = state.pipeline.router.resolve(request.method, request.path)
            # (routes told apart by model: which one is in the body, not read here)
            route = candidates[0] if len(candidates) == 1 else None
            state.metrics.observe_request(
                route.name if route else "-", route.backend if route else "-", 503, 0.0
            )
            return turned_away()
        resp = await handler(request)
        if state.draining:
            # an answer finished during the drain closes its connection (a response not yet
            # sent says so in Connection: close): the client's next request goes to a fresh
            # connection, which the load balancer sends elsewhere, not to a 503 here
            resp.force_close()
        return resp

    return guarded
