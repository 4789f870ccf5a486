"""The handler the server runs: model traffic goes straight to the pipeline; the admin API, the
probes and anything unusual (a target or header the request_target middleware would rewrite or
refuse, `Expect`, the admin listener) go through aiohttp's router and middlewares as before.

Every path but /admin/* and the probes can only match the catch-all route, so resolving it
through the router, the middleware chain and the listener split cost about a tenth of a cache
hit's CPU for nothing. The fast path serves exactly the requests the router would have handed
to `Pipeline.handle`; a request it is not sure about takes the full way.

The fast path sets no `request.match_info` (nor `request.app`): the pipeline uses neither.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import PlainResource

from gateway.drain import CATCH_ALL_RESOURCE, unless_draining
from gateway.middleware.listener_roles import ROLES, split_admin
from gateway.middleware.request_target import plain_target, safe_target, undecodable_header
from gateway.state import STATE

log = logging.getLogger("latentgate.dispatch")


def model_traffic_handler(app: web.Application) -> Handler:
    """app._handle with a shortcut to the pipeline for model traffic."""
    full: Handler = app._handle
    unknown = [m for m in app.middlewares if m not in (safe_target, split_admin)]
    if unknown:  # a middleware this shortcut does not know of: everything takes the full way
        return _full_way(full, f"middleware {unknown[0]!r}")
    # Every path the app registered besides the catch-all (probes, /v2 server calls, the admin
    # API) takes the full way; a route with a pattern would need the router itself to match.
    own: set[str] = set()
    catch_all = app.get(CATCH_ALL_RESOURCE)
    for resource in app.router.resources():
        if isinstance(resource, PlainResource):
            own.add(resource.canonical)
        elif resource is not catch_all:
            return _full_way(full, f"route {resource.canonical}")
    if catch_all is None:
        return _full_way(full, "no catch-all model route")
    state = app[STATE]
    model_traffic = unless_draining(state, state.pipeline.handle)  # the catch-all's handler
    roles = app[ROLES]
    split = split_admin in app.middlewares

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if (
            path in own
            or path.startswith("/admin")
            # aiohttp answers `Expect: 100-continue` in the router's path
            or "Expect" in request.headers
            or (split and roles.on_admin(request))
            # what the request_target middleware would change or refuse
            or not plain_target(request.raw_path)
            or undecodable_header(request) is not None
        ):
            return await full(request)
        return await model_traffic(request)

    log.debug("model traffic goes straight to the pipeline")
    return handle


def _full_way(full: Handler, why: str) -> Handler:
    # said aloud: the shortcut is worth about a tenth of a cache hit's CPU
    log.warning("model traffic takes aiohttp's router and middlewares (%s)", why)
    return full
