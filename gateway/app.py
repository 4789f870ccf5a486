"""build_app(settings): the only place long-lived objects are constructed and wired."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from backends import Backend, build_backends
from backends.remote.metrics import RemoteMetrics
from backends.settings import BackendSettings
from gateway import admin, reload
from gateway.config import RouteSettings, Settings
from gateway.metrics import Metrics
from gateway.middleware import listener_roles
from gateway.pipeline import Pipeline
from gateway.protocols.base import Adapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.passthrough import PassthroughAdapter
from gateway.protocols.v2 import V2Adapter
from gateway.routing import Route, Router
from gateway.state import STATE, AppState
from gateway.tracing import build_tracing


def build_adapter(route: RouteSettings) -> Adapter:
    if route.protocol == "openai":
        return OpenAIAdapter(frozenset(route.cache.exact.key.ignore_fields))
    if route.protocol == "v2":
        return V2Adapter(route.cache.semantic.field)
    return PassthroughAdapter()


def build_router(settings: Settings) -> Router:
    return Router([Route.from_settings(r, build_adapter(r)) for r in settings.routes])


def build_app(settings: Settings, config_path: str | None = None) -> web.Application:
    metrics = Metrics()
    remote_metrics = RemoteMetrics(metrics.registry)  # one set per registry; reloads reuse it
    local_metrics: list[Any] = []  # created on the first local backend, then reused

    def make_backends(specs: Mapping[str, BackendSettings]) -> dict[str, Backend]:
        if not local_metrics and any(s.kind != "remote" for s in specs.values()):
            from backends.local.metrics import LocalMetrics

            local_metrics.append(LocalMetrics(metrics.registry))
        return build_backends(
            specs, metrics.registry, remote_metrics=remote_metrics,
            local_metrics=local_metrics[0] if local_metrics else None,
        )

    backends = make_backends(settings.backends)
    router = build_router(settings)
    pipeline = Pipeline(router, backends, metrics, settings.limits)
    pipeline.tracing = build_tracing(settings.tracing)
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
    listener_roles.install(app, separate=settings.admin.listener is not None)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        for backend in backends.values():
            start = getattr(backend, "start", None)  # pools start health checks; local engines warm up
            if start is not None:
                await start()
        yield
        for backend in state.backends.values():  # the current generation's (reloads swap them)
            await backend.aclose()
        pipeline.tracing.shutdown()

    app.cleanup_ctx.append(lifecycle)
    admin.register(app)
    reload.register(app, config_path, build_router, make_backends)
    app.router.add_route("*", "/{tail:.*}", pipeline.handle)
    return app
