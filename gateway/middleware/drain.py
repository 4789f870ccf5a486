"""While the gateway drains (SIGTERM), the listeners stay open: probes answer (/readyz says 503,
so load balancers stop sending), every other new request gets 503 with Retry-After, and every
response closes its connection so clients reconnect elsewhere. In-flight requests finish.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.middleware.listener_roles import PROBES
from gateway.state import STATE

# Server-level v2 health answers like /readyz (a Triton client polls these).
_ANSWERED = PROBES | {"/v2/health/live", "/v2/health/ready"}


def _draining() -> web.Response:
    body = {
        "error": {
            "message": "the gateway is shutting down; retry on another instance",
            "type": "unavailable",
            "param": None,
            "code": 503,
        }
    }
    return web.Response(
        status=503,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers={"Retry-After": "1"},
    )


@web.middleware
async def drain(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.app[STATE].draining:
        return await handler(request)
    resp = await handler(request) if request.path in _ANSWERED else _draining()
    resp.force_close()
    return resp


def install(app: web.Application) -> None:
    app.middlewares.append(drain)
