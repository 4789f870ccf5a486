"""Keeps the admin API on its own listener: with `admin.listener` set, /admin/* answers only
there, the admin listener serves no model traffic, and the probes (/healthz /readyz /metrics)
answer on both.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.typedefs import Handler

PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


class ListenerRoles:
    """Addresses (TCP port or unix path) of the admin listener, filled in once bound."""

    def __init__(self) -> None:
        self.admin: set[int | str] = set()

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


def _not_found(path: str) -> web.Response:
    body = {
        "error": {
            "message": f"no route for {path} on this listener",
            "type": "not_found",
            "param": None,
            "code": 404,
        }
    }
    return web.Response(status=404, body=json.dumps(body).encode(), content_type="application/json")


@web.middleware
async def split_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    if path in PROBES:
        return await handler(request)
    on_admin = request.app[ROLES].on_admin(request)
    is_admin_path = path == "/admin" or path.startswith("/admin/")
    if is_admin_path != on_admin:
        return _not_found(path)
    return await handler(request)


def install(app: web.Application, separate: bool) -> None:
    """Register the roles (always, so the server can fill them) and the split when separate."""
    app[ROLES] = ListenerRoles()
    if separate:
        app.middlewares.append(split_admin)
