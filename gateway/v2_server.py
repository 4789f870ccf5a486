"""The Open Inference (KServe v2 / Triton) server-level API, answered by the gateway itself.

`/v2/health/live`, `/v2/health/ready` and `GET /v2` describe this gateway, not an upstream: a
Triton client pointed at the gateway works with no upstream running. Model-level calls
(`/v2/models/...`) still follow the routes (local models answer them in-process).
"""

from __future__ import annotations

import json

from aiohttp import web

from gateway.readiness import readiness
from gateway.state import STATE
from gateway.version import version

# binary_tensor_data: the v2 adapter reads binary inputs; model_configuration: local models
# answer GET /v2/models/{name}/config.
EXTENSIONS = ["binary_tensor_data", "model_configuration"]


def _json(doc: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(doc).encode(), content_type="application/json"
    )


async def live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok, _ = await readiness(request.app[STATE])
    return _json({"ready": ok}, 200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "latentgate", "version": version(), "extensions": EXTENSIONS})


def register(app: web.Application) -> None:
    """Before the catch-all route, like /healthz."""
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/", server_metadata)
