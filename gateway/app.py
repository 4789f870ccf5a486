"""build_app(settings): the only place long-lived objects are constructed and wired."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from backends import build_backends
from cache.cache import Cache
from cache.semantic.setup import build_semantic, semantic_routes
from gateway import admin, admin_semantic
from gateway.cache_stage import CacheStage
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
    backends = build_backends(settings.backends)
    router = Router([Route.from_settings(r, build_adapter(r)) for r in settings.routes])
    cache = Cache(settings.cache, metrics.registry)
    route_caches = {r.name: rc for r in settings.routes if (rc := cache.for_route(r.name, r.cache.exact))}
    semantic = build_semantic(settings.cache, metrics.registry, settings.routes)
    if semantic is not None:
        cache.purge_listeners.append(semantic.purge)
    stage = CacheStage(route_caches, semantic_routes(semantic))
    pipeline = Pipeline(router, backends, metrics, settings.limits, stage)
    state = AppState(settings=settings, metrics=metrics, backends=backends, pipeline=pipeline, cache=cache)

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
        await cache.open()
        if semantic is not None:
            await semantic.open()
        yield
        if semantic is not None:
            await semantic.aclose()
        for backend in backends.values():
            await backend.aclose()
        await cache.aclose()

    app.cleanup_ctx.append(lifecycle)
    admin.register(app)
    if semantic is not None:
        admin_semantic.register(app, semantic)
    app.router.add_route("*", "/{tail:.*}", pipeline.handle)
    return app
