"""Keeps the admin API on its own listener: with `admin.listener` set, /admin/* answers only
there, the admin listener serves no model traffic, and the probes (/healthz /readyz /metrics)
answer on both, unless `admin.metrics: admin_listener` keeps /metrics on the admin one alone.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import PlainResource

PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


class ListenerRoles:
    """Addresses (TCP port or unix path) of the admin listener, filled in once bound."""

    def __init__(self, metrics_on_admin: bool = False) -> None:
        self.admin: set[int | str] = set()
        self.metrics_on_admin = metrics_on_admin

    def add_admin_site(self, site: web.BaseSite) -> None:
        server = getattr(site, "_server", None)
        for sock in getattr(server, "sockets", None) or []:
            name = sock.getsockname()
            self.admin.add(name[1] if isinstance(name, tuple) else str(name))

    def on_admin(self, request: web.Request) -> bool:
        transport = request.transport
        name = transport.get_extra_info("sockname") if transport is not None else None
        key = name[1] if isinstance(name, tuple) else str(name)
        return key in self.admin


ROLES: web.AppKey[ListenerRoles] = web.AppKey("latentgate_listener_roles", ListenerRoles)


def _error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def not_found(path: str) -> web.Response:
    """The JSON 404 of a path this listener does not serve."""
    return _error(404, "not_found", f"no route for {path} on this listener")


def is_admin_path(path: str) -> bool:
    return path == "/admin" or path.startswith("/admin/")


def admin_stays_here(handler: Handler) -> Handler:
    """The catch-all model route's handler, with /admin/* kept out of it: an admin path or
    method the admin API does not have would otherwise be forwarded upstream, with whatever
    credentials it carried (the admin token). Here it is a JSON 404, or 405 with `Allow`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if not is_admin_path(path):
            return await handler(request)
        allowed = sorted(
            route.method
            for resource in request.app.router.resources()
            if isinstance(resource, PlainResource) and resource.canonical == path
            for route in resource
        )
        if allowed:
            return _error(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {path}",
                {"Allow": ", ".join(allowed)},
            )
        return _error(404, "not_found", f"no admin endpoint {path}")

    return handle


def refusal(request: web.Request) -> web.Response | None:
    """The 404 of a path this listener does not serve, with an admin listener; None: served."""
    path = request.path
    roles = request.app[ROLES]
    kept = is_admin_path(path) or (roles.metrics_on_admin and path == "/metrics")
    if path in PROBES and not kept:
        return None
    return not_found(path) if kept != roles.on_admin(request) else None


@web.middleware
async def split_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = refusal(request)
    return refused if refused is not None else await handler(request)


def install(app: web.Application, separate: bool, metrics_on_admin: bool = False) -> None:
    """Register the roles (always, so the server can fill them) and the split when separate
    (metrics_on_admin: /metrics answers on the admin listener alone)."""
    app[ROLES] = ListenerRoles(metrics_on_admin)
    if separate:
        app.middlewares.append(split_admin)
