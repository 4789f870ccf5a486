"""The Python floor: a bare aiohttp + uvloop reverse proxy with no header rules, metrics or limits.

Usage: python bench/bare_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web


def build(upstream: str) -> web.Application:
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)))
        yield
        await sessions[0].close()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        ctype = request.headers.get("Content-Type", "application/octet-stream")
        async with sessions[0].request(
            request.method, upstream + request.path_qs, data=body, headers={"Content-Type": ctype}
        ) as up:
            data = await up.read()
            return web.Response(status=up.status, body=data, content_type=up.content_type)

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


if __name__ == "__main__":
    uvloop.install()
    web.run_app(
        build(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None
    )
