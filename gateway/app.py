"""build_app(settings): the only place long-lived objects are constructed and wired."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from backends import build_backends
from gateway import admin
from gateway.config import RouteSettings, Settings
from gateway.metrics import Metrics
from gateway.pipeline import Pipeline
from gateway.protocols.base import Adapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.passthrough import PassthroughAdapter
from gateway.protocols.v2 import V2Adapter
from gateway.routing import Route, Router
from gateway.state import STATE, AppState


def build_adapter(route: RouteSettings) -> Adapter:
    if route.protocol == "openai":
        return OpenAIAdapter(frozenset(route.cache.exact.key.ignore_fields))
    if route.protocol == "v2":
        return V2Adapter(route.cache.semantic.field)
    return PassthroughAdapter()


def build_app(settings: Settings) -> web.Application:
    metrics = Metrics()
    backends = build_backends(settings.backends, metrics.registry)
    router = Router([Route.from_settings(r, build_adapter(r)) for r in settings.routes])
    pipeline = Pipeline(router, backends, metrics, settings.limits)
    state = AppState(settings=settings, metrics=metrics, backends=backends, pipeline=pipeline)

    def pool_source() -> dict[str, dict[str, dict[str, int]]]:
        out = {}
        for name, b in state.backends.items():
            stats = getattr(b, "pool_stats", None)
            if stats is not None:
                out[name] = stats()
        return out

    metrics.add_pool_source(pool_source)

    app = web.Application(client_max_size=settings.limits.max_body_bytes, handler_args=None)
    app[STATE] = state

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        for backend in backends.values():
            start = getattr(backend, "start", None)  # pools start health checks; local engines warm up
            if start is not None:
                await start()
        yield
        for backend in backends.values():
            await backend.aclose()

    app.cleanup_ctx.append(lifecycle)
    admin.register(app)
    app.router.add_route("*", "/{tail:.*}", pipeline.handle)
    return app
