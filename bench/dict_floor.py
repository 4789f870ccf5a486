"""The Python floor for a cache hit: a bare aiohttp + uvloop handler answering from a dict keyed
by the request body (no headers, metrics or limits).

Usage: python bench/dict_floor.py PORT ANSWER_JSON
"""

from __future__ import annotations

import sys

import uvloop
from aiohttp import web


def build(answer: bytes) -> web.Application:
    store: dict[bytes, bytes] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        hit = store.get(body)
        if hit is None:
            hit = store[body] = answer
        return web.Response(body=hit, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


if __name__ == "__main__":
    uvloop.install()
    web.run_app(
        build(sys.argv[2].encode()),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        access_log=None,
        print=None,
    )
