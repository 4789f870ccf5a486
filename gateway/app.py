"""build_app(settings): the only place long-lived objects are constructed and wired."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from backends import Backend, BackendSettings, RemoteMetrics, build_backends
from backends.local import EngineShare
from cache import (
    Cache,
    CacheEntry,
    CacheFlow,
    Flows,
    NoSemantic,
    SemanticRoute,
    SingleFlight,
    build_semantic,
    semantic_routes,
)
from gateway import admin, admin_semantic, reload, v2_server
from gateway.config import RouteSettings, Settings
from gateway.drain import CATCH_ALL, CATCH_ALL_RESOURCE, unless_draining
from gateway.expect import expect_handler
from gateway.headers import SERVER
from gateway.metrics import Metrics
from gateway.middleware import listener_roles, request_target
from gateway.pipeline import Pipeline
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import Adapter
from gateway.protocols.grpc import GrpcRouteAdapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.passthrough import PassthroughAdapter
from gateway.protocols.v2 import V2Adapter
from gateway.routing import Route, Router
from gateway.state import STATE, AppState
from gateway.tracing import build_tracing


async def _name_the_server(_request: web.Request, response: web.StreamResponse) -> None:
    # before aiohttp adds its own (gateway.headers.SERVER says why)
    response.headers["Server"] = SERVER


def build_adapter(route: RouteSettings) -> Adapter:
    if route.protocol == "openai":
        return OpenAIAdapter(frozenset(route.cache.exact.key.ignore_fields), route.limits.max_items)
    if route.protocol == "anthropic":
        return AnthropicAdapter(frozenset(route.cache.exact.key.ignore_fields))
    if route.protocol == "v2":
        return V2Adapter(route.cache.semantic.field, route.limits.max_items)
    if route.protocol == "grpc":
        return GrpcRouteAdapter()
    return PassthroughAdapter()


def build_router(settings: Settings) -> Router:
    return Router([Route.from_settings(r, build_adapter(r)) for r in settings.routes])


# What a local engine's answers depend on (its batching, threads and providers do not change them).
_ENGINE_ANSWERS = ("kind", "model", "served_name", "task", "precision", "preprocess")


def answers_from(name: str, spec: BackendSettings) -> str:
    """What a route's answers come from, for its keys (cache.keys.key_scope): the backend's name,
    and for a local engine its model and what reads the input. A remote pool is its name: its
    replicas serve one model, and scaling it (another replica) keeps its entries."""
    if spec.kind == "remote":
        return name
    return json.dumps(
        {"backend": name, **spec.model_dump(mode="json", include=set(_ENGINE_ANSWERS))},
        sort_keys=True,
    )


def build_app(settings: Settings, config_path: str | None = None) -> web.Application:
    metrics = Metrics()
    remote_metrics = RemoteMetrics(metrics.registry)  # one set per registry; reloads reuse it
    local_metrics: list[Any] = []  # one set per registry: local backends and the embedder share it

    def engine_metrics() -> Any:
        if not local_metrics:
            from backends.local import LocalMetrics

            local_metrics.append(LocalMetrics(metrics.registry))
        return local_metrics[0]

    # One inference session per model file and settings for this app: local backends (across
    # reloads too) and the semantic embedder share the MiniLM session.
    engines = EngineShare()

    def make_backends(specs: Mapping[str, BackendSettings]) -> dict[str, Backend]:
        local = any(s.kind != "remote" for s in specs.values())
        return build_backends(
            specs,
            metrics.registry,
            remote_metrics=remote_metrics,
            local_metrics=engine_metrics() if local else None,
            engines=engines,
            # a gRPC replica's reply is received whole: held to what the listener takes
            answer_cap=settings.limits.max_body_bytes,
        )

    backends = make_backends(settings.backends)
    router = build_router(settings)
    cache = Cache(settings.cache, metrics.registry)
    semantic = build_semantic(
        settings.cache,
        metrics.registry,
        settings.routes,
        engine_metrics,
        engines,
        # a judge backend (answer_match: judge) is looked up when it judges: reloads swap them
        lambda name: state.backends.get(name),
    )
    if semantic is not None:
        cache.purge_listeners.append(semantic.purge)
        # its index publisher writes only while the exact tier's write breaker lets writes go
        semantic.writes = cache.redis.writes if cache.redis is not None else None
    by_route: Mapping[str, SemanticRoute] = semantic_routes(semantic)
    no_semantic = NoSemantic()
    flights: SingleFlight[CacheEntry | None] = cache.flights

    def build_flows(config: Settings) -> dict[str, CacheFlow]:
        """Each cached route's flow; routes share the process's single flight."""
        flows = {}
        for r in config.routes:
            upstream = answers_from(r.backend, config.backends[r.backend])
            keyed = build_adapter(r).keyed_headers
            rc = cache.for_route(r.name, r.cache.exact, upstream, keyed)
            if rc is not None:
                # a reload that turns a route's semantic cache off takes effect at once (its
                # other semantic settings need a restart: reload.semantic_kept)
                sr = by_route.get(r.name, no_semantic) if r.cache.semantic.enabled else no_semantic
                flows[r.name] = CacheFlow(rc, sr, flights)
        return flows

    flows = Flows(build_flows(settings))
    pipeline = Pipeline(router, backends, metrics, settings.limits, flows)
    pipeline.tracing = build_tracing(settings.tracing)
    state = AppState(
        settings=settings,
        metrics=metrics,
        backends=backends,
        pipeline=pipeline,
        cache=cache,
        semantic=semantic,
    )

    def swap_policies(new: Settings) -> Flows:
        """A reload's cache policies: each route's cache rebuilt from its new exact policy (the
        reload puts them in the new runtime, beside the routes they belong to)."""
        new_flows = build_flows(new)
        for name in [n for n in cache.routes if n not in new_flows]:
            del cache.routes[name]
        if semantic is not None:
            # a route's semantic stage serves only through its exact cache's flow: a reload that
            # turns the exact cache off turns the semantic one off too (and its bar says so)
            semantic.serve_only(
                {r.name for r in new.routes if r.cache.semantic.enabled and r.name in new_flows}
            )
        return Flows(new_flows)

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
    app.on_response_prepare.append(_name_the_server)
    listener_roles.install(
        app,
        separate=settings.admin.listener is not None,
        metrics_on_admin=settings.admin.metrics == "admin_listener",
    )
    request_target.install(app)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await cache.open()
        # Models load in the background (the first start exports them: ~20 s): the listeners
        # open at once, /healthz answers, /readyz says 503 with the progress until they are in.
        if semantic is not None:
            semantic.start()
        for backend in backends.values():
            start = getattr(backend, "start", None)  # pools start health checks; engines warm up
            if start is not None:
                await start()
        yield
        for backend in state.backends.values():  # the current generation's (reloads swap them)
            await backend.aclose()
        pipeline.tracing.shutdown()
        if semantic is not None:
            await semantic.aclose()
        await cache.aclose()

    app.cleanup_ctx.append(lifecycle)
    if any(lst.protocol == "grpc" for lst in settings.listeners):
        from gateway.grpc import server as grpc_server  # grpc loads only when a listener needs it

        grpc_server.install(app, state)  # after `lifecycle`: starts after, stops before backends
    admin.register(app)
    v2_server.register(app)
    reload.register(app, config_path, build_router, make_backends, swap_policies)
    if semantic is not None:
        admin_semantic.register(app, semantic)
    model_route = app.router.add_route(
        "*",
        CATCH_ALL,
        listener_roles.admin_stays_here(unless_draining(state, pipeline.handle)),
        expect_handler=expect_handler(lambda: pipeline.router, settings.limits),
    )
    assert model_route.resource is not None
    app[CATCH_ALL_RESOURCE] = model_route.resource
    return app
