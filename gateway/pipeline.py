"""One request end to end: route → read and parse → (cache flow) → dispatch → respond.

On a cached route the pipeline parses, asks the route's cache flow (cache/flow.py) with one
backend callable, and hands what it got to the response writer (gateway/responses.py). Nothing
here talks to Redis, runs a model, or decides what is cached.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar

from aiohttp import web

from backends import (
    Backend,
    BadInput,
    EngineError,
    ModelNotFound,
    Overloaded,
    RequestBodyError,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamTimeout,
)
from cache import (
    CACHED_METHODS,
    CONDITIONAL_HEADERS,
    SAFE_METHODS,
    AliasKey,
    Ask,
    CacheFlow,
    Flows,
    Hit,
    NotCached,
    request_directives,
)
from gateway import hit_lane, request_body, responses
from gateway.client_left import unless_client_left
from gateway.codings import coding_error
from gateway.config import LimitSettings
from gateway.deadline import route_budget_s, within
from gateway.errors import (
    BadGateway,
    BadRequest,
    GatewayError,
    GatewayTimeout,
    MethodNotAllowed,
    NotFound,
    NotInCache,
    PayloadTooLarge,
    ServiceUnavailable,
)
from gateway.headers import end_to_end, field, upstream_headers
from gateway.invalidation import invalidate_get, stored_answer
from gateway.metrics import Metrics
from gateway.protocols.base import Call
from gateway.render import framing_of
from gateway.routing import Route, Router
from gateway.runtime import Runtime
from gateway.timing import Timing
from gateway.tracing import NoTracing, Tracing

log = logging.getLogger("latentgate.pipeline")

# Passthrough bodies larger than this (or of unknown length) stream through instead of buffering.
_STREAM_BODY_OVER = 1 << 20
# Bodies larger than this are parsed (and keyed) in a worker thread.
_PARSE_INLINE = 256 << 10


class Pipeline:
    def __init__(
        self,
        router: Router,
        backends: Mapping[str, Backend],
        metrics: Metrics,
        limits: LimitSettings,
        flows: Flows | None = None,
    ) -> None:
        # Routes, backends and route caches live in one swappable Runtime (gateway/reload.py
        # swaps it); each request pins the generation it started on, so in-flight work finishes
        # on the old one.
        self.runtime = Runtime(router, backends, flows=flows if flows is not None else Flows())
        self._pinned: ContextVar[Runtime] = ContextVar("latentgate_runtime")
        self.metrics = metrics
        self.limits = limits
        self.tracing: Tracing = NoTracing()  # build_app sets the OTel one when tracing is on
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        # Read at scrape time: no lock-taking gauge update on every request.
        metrics.in_flight.set_function(lambda: self.in_flight)

    @property
    def router(self) -> Router:
        return self._pinned.get(self.runtime).router

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self._pinned.get(self.runtime).backends

    @property
    def flows(self) -> Flows:
        return self._pinned.get(self.runtime).flows

    async def handle(self, request: web.Request) -> web.StreamResponse:
        tracing = self.tracing
        span = tracing.start(request)  # (first: every stage, the lane's too, lies inside it)
        timing = Timing()
        lane = hit_lane.answer(
            request, timing, self.runtime.router, self.runtime.flows, self.limits, self.metrics
        )
        if isinstance(lane, web.StreamResponse):
            tracing.finish(span, timing, lane.status)
            return lane
        early = lane
        runtime = self.runtime
        runtime.enter()
        pin = self._pinned.set(runtime)
        status = 500
        try:
            resp = await self._handle(request, timing, early)
            status = resp.status
            return resp
        finally:
            self.tracing.finish(span, timing, status)
            self._pinned.reset(pin)
            runtime.leave()

    async def _handle(
        self, request: web.Request, timing: Timing, early: hit_lane.Early | None = None
    ) -> web.StreamResponse:
        self.in_flight += 1
        self.idle.clear()
        status = 500
        protocol = "passthrough"
        served: list[Route] = []  # the route that serves, once known (picked by model or not)
        try:
            candidates, partial = self.router.resolve(request.method, request.path)
            if not candidates:
                if partial:
                    raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
                raise NotFound(f"no route for {request.path}")
            served.append(candidates[0])
            protocol = candidates[0].protocol
            resp = await self._serve(request, candidates, timing, early, served)
            status = resp.status
            return resp
        except GatewayError as err:
            status = err.status
            return responses.error(protocol, err, timing)
        except BadInput as exc:  # a shared codec (backends.v2tensors) found the client's mistake
            status = 400
            return responses.error(protocol, BadRequest(str(exc)), timing)
        except RecursionError:
            # JSON within the decoder's depth (~990) can still be deeper than a walk over it
            # allows (the key's normalise, the namespace): the body's shape, not a fault here.
            status = 400
            deep = BadRequest("request body is nested too deeply")
            return responses.error(protocol, deep, timing)
        finally:
            route_name, backend_name = (
                (served[-1].name, served[-1].backend) if served else ("-", "-")
            )
            self.metrics.observe_request(
                route_name, backend_name, status, time.perf_counter() - timing.start
            )
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def _serve(
        self,
        request: web.Request,
        candidates: list[Route],
        timing: Timing,
        early: hit_lane.Early | None = None,
        served: list[Route] | None = None,
    ) -> web.StreamResponse:
        """served: the route chosen by model is appended to it (the request's metrics name
        the route and backend that answered, not the first candidate)."""
        route = candidates[0]
        t = timing.start
        body: bytes | AsyncIterator[bytes]
        refused = coding_error(request.headers) if request.body_exists else None
        if refused is not None:
            raise refused
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            raise PayloadTooLarge(
                f"request body of {length} bytes exceeds {self.limits.max_body_bytes}"
            )
        cached = route.policy.exact.enabled  # a key needs the whole body, even on passthrough
        parsed = route.protocol != "passthrough" or len(candidates) > 1 or cached
        if early is not None:  # the hit lane took the body (and looked for an alias) already
            body = early.body
            if len(body) > self.limits.max_body_bytes:
                raise PayloadTooLarge(f"request body exceeds {self.limits.max_body_bytes} bytes")
        elif parsed or (length is not None and length <= _STREAM_BODY_OVER):
            body = await request_body.read(request, self.limits)
        else:
            body = request_body.stream(request, self.limits)
        flow = self.flows.get(route.name) if cached and isinstance(body, bytes) else None
        # the lane's alias (None when it did not look): remembered on the long way
        alias: AliasKey | None = early.alias if early is not None else None
        call: Call | None = None
        if isinstance(body, bytes) and (route.protocol != "passthrough" or cached):
            parse = functools.partial(
                route.adapter.parse,
                request.method,
                # every key covers the path as it goes upstream: /a%2Fb is not /a/b (a v2 key's
                # model and version are segments of it; an OpenAI or Messages adapter reads its
                # endpoint from the decoded path, and keys the raw one: /v1/chat%2Fcompletions
                # is another resource to an upstream that routes on the raw path, as aiohttp does)
                request.raw_path.partition("?")[0],
                # the query as sent, as it goes upstream: decoded, `?a=%2526` (a is "%26") was
                # keyed as `?a=%26` (a is "&"), and `?q=x+y` as `?q=x%20y`
                request.raw_path.partition("?")[2],
                # as the upstream gets them: a header the client's Connection nominates is not
                # sent, so the key must not read the body by it either
                (seen := end_to_end(request.headers)).get("Content-Type", ""),
                body,
                seen,
            )
            # Megabytes of JSON take 100s of ms to decode: off the event loop, so health checks
            # and cache hits keep being answered meanwhile.
            call = await asyncio.to_thread(parse) if len(body) > _PARSE_INLINE else parse()
            if len(candidates) > 1:
                picked = Router.pick_by_model(candidates, call.model if call else None)
                if picked is None:
                    if served is not None:
                        served.clear()  # no route took it: counted as route "-"
                    raise NotFound(
                        f"no route for model {call.model if call else None!r} on {request.path}"
                    )
                route = picked
                if served is not None:
                    served.append(route)
                flow = self.flows.get(route.name)
            t = timing.add("parse", t)

        def upstream_request() -> UpstreamRequest:
            return UpstreamRequest(
                method=request.method,
                path_qs=request.raw_path,
                headers=upstream_headers(
                    [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers],
                    client_ip=request.remote,
                    proto=request.scheme,
                    host=request.host,
                    keep_length=not isinstance(body, bytes),
                    identity=flow is not None,
                ),
                body=body
                if (isinstance(body, bytes) and body) or not isinstance(body, bytes)
                else None,
                policy=route.upstream,
            )

        if flow is not None and call is not None and isinstance(body, bytes):
            return await self._cached(
                request, route, flow, call, body, timing, upstream_request, alias
            )
        upstream = await self._send(route, upstream_request(), request)
        timing.add(self.backends[route.backend].timing_stage, t)
        return await responses.upstream(
            request, upstream, timing, self._count_cut, protocol=route.protocol
        )

    async def _cached(
        self,
        request: web.Request,
        route: Route,
        flow: CacheFlow,
        call: Call,
        body: bytes,
        timing: Timing,
        upstream_request: Callable[[], UpstreamRequest],
        alias: AliasKey | None,
    ) -> web.StreamResponse:
        headers = request.headers
        cc, pragma = field(headers, "Cache-Control"), field(headers, "Pragma")
        conditional = any(h in headers for h in CONDITIONAL_HEADERS)
        # a HEAD, or an If-None-Match, answered from the stored GET of its target
        stored = await stored_answer(self.router, self.flows, request, conditional, timing)
        if stored is not None:
            return stored
        directives = request_directives(
            cc,
            pragma,
            conditional,
            head=request.method == "HEAD",
            unsafe=request.method not in CACHED_METHODS,
        )
        stage = self.backends[route.backend].timing_stage
        # sampled and no-store calls never touch the cache: no key, no alias
        try:
            passed = await flow.bypass(
                call,
                directives,
                timing,
                stage,
                lambda: self._send(route, upstream_request(), request),
            )
        except NotCached as exc:
            raise NotInCache(str(exc)) from None
        if passed is not None:
            if (
                passed.reason == "unsafe-method"
                and request.method not in SAFE_METHODS
                and 200 <= passed.response.status < 400
            ):
                await invalidate_get(self.router, self.flows, request)
            return await responses.fresh(request, passed, timing, self._count_cut, route.protocol)
        framing = framing_of(call)
        if len(body) > _PARSE_INLINE:  # canonicalising megabytes is as slow as parsing them
            key = await asyncio.to_thread(flow.key, call.model, call.key_fields, headers)
        else:
            key = flow.key(call.model, call.key_fields, headers)
        # A v2 answer echoes its request's id, which the key leaves out: these bytes may take
        # the alias lane (which serves the entry as stored) only for an entry known to carry
        # this request's id (below, pinned to that entry).
        v2 = call.protocol == "v2"
        if alias is not None and not v2:  # (None: the fast path never looks, e.g. by model)
            flow.aliases.remember(alias, key, framing)
        budget = route_budget_s(route, self.backends[route.backend])
        ask = Ask(
            key=key,
            directives=directives,
            call=call,
            kind=call.kind,
            answers=framing,
            clock=timing,
            compute_stage=stage,
            budget_s=budget,
        )
        compute = within(
            ask.left_s, budget, upstream_request, lambda req: self._send(route, req, request)
        )
        try:
            result = await flow.run(ask, compute)
        except UpstreamError as exc:  # the leader's stream broke: its waiters get a 502 too
            raise BadGateway(f"upstream {route.backend} failed: {exc}") from None
        except NotCached as exc:
            raise NotInCache(str(exc)) from None
        if isinstance(result, Hit):
            own = (
                responses.with_request_id(result, framing, call.extra.get("request_id"))
                if v2
                else None
            )
            if v2 and own is None and alias is not None:
                # this entry says this id: the alias serves it, and no later refill of the key
                flow.aliases.remember(alias, key, framing, pin=result.entry.created_at)
            return responses.cached(request, result, framing, timing, own)
        return await responses.fresh(request, result, timing, self._count_cut, route.protocol)

    def _count_cut(self) -> None:
        self.metrics.upstream_errors.labels("-", "stream_cut").inc()

    async def _send(
        self, route: Route, req: UpstreamRequest, client: web.Request | None = None
    ) -> UpstreamResponse:
        backend = self.backends[route.backend]
        self.tracing.inject(req)
        try:
            if client is not None and getattr(backend, "computes_here", False):
                return await unless_client_left(backend.send(req), client)
            return await backend.send(req)
        except UpstreamTimeout as exc:
            self.metrics.upstream_errors.labels(route.backend, "timeout").inc()
            raise GatewayTimeout(f"upstream {route.backend} timed out: {exc}") from None
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(route.backend, type(exc).__name__).inc()
            raise BadGateway(f"upstream {route.backend} failed: {exc}") from None
        except Overloaded as exc:
            raise ServiceUnavailable(
                str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after_s)))}
            ) from None
        except BadInput as exc:
            raise BadRequest(str(exc)) from None
        except RequestBodyError as exc:
            raise exc.answer from None
        except ModelNotFound as exc:
            raise NotFound(str(exc)) from None
        except EngineError as exc:
            self.metrics.upstream_errors.labels(route.backend, type(exc).__name__).inc()
            raise GatewayError(f"local engine {route.backend} failed: {exc}") from None
