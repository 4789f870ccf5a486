"""One request end to end: route → read and parse → dispatch → respond, with Server-Timing.

Cache stages plug in between parse and dispatch; nothing here talks to Redis or runs a model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar

from aiohttp import web

from backends import (
    Backend,
    BadInput,
    EngineError,
    ModelNotFound,
    Overloaded,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamTimeout,
)
from gateway.cache_stage import CacheStage
from gateway.config import LimitSettings
from gateway.errors import (
    BadGateway,
    BadRequest,
    GatewayError,
    GatewayTimeout,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    error_body,
)
from gateway.headers import downstream_headers, upstream_headers
from gateway.metrics import Metrics
from gateway.protocols.base import Call
from gateway.routing import Route, Router
from gateway.runtime import Runtime
from gateway.tracing import NoTracing, Tracing

log = logging.getLogger("latentgate.pipeline")

# Passthrough bodies larger than this (or of unknown length) stream through instead of buffering.
_STREAM_BODY_OVER = 1 << 20
# Bodies larger than this are parsed (and keyed) in a worker thread.
_PARSE_INLINE = 256 << 10


class Timing:
    """Stage durations for Server-Timing, in insertion order."""

    __slots__ = ("stages", "start")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def add(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.stages.append((name, now - since))
        return now

    def header(self) -> str:
        total = time.perf_counter() - self.start
        parts = [f"{n};dur={d * 1000:.3f}" for n, d in self.stages]
        parts.append(f"total;dur={total * 1000:.3f}")
        return ", ".join(parts)


class Pipeline:
    def __init__(
        self,
        router: Router,
        backends: Mapping[str, Backend],
        metrics: Metrics,
        limits: LimitSettings,
        cache: CacheStage | None = None,
    ) -> None:
        self.cache = cache
        # Routes and backends live in one swappable Runtime (gateway/reload.py swaps it); each
        # request pins the generation it started on, so in-flight work finishes on the old one.
        self.runtime = Runtime(router, backends)
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

    async def handle(self, request: web.Request) -> web.StreamResponse:
        runtime = self.runtime
        runtime.enter()
        pin = self._pinned.set(runtime)
        span = self.tracing.start(request)
        timing = Timing()
        status = 500
        try:
            resp = await self._handle(request, timing)
            status = resp.status
            return resp
        finally:
            self.tracing.finish(span, timing, status)
            self._pinned.reset(pin)
            runtime.leave()

    async def _handle(self, request: web.Request, timing: Timing) -> web.StreamResponse:
        self.in_flight += 1
        self.idle.clear()
        route_name, backend_name, status = "-", "-", 500
        protocol = "passthrough"
        try:
            candidates, partial = self.router.resolve(request.method, request.path)
            if not candidates:
                if partial:
                    raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
                raise NotFound(f"no route for {request.path}")
            route = candidates[0]
            protocol, route_name, backend_name = route.protocol, route.name, route.backend
            resp = await self._serve(request, candidates, timing)
            status = resp.status
            return resp
        except GatewayError as err:
            status = err.status
            return self._error(protocol, err, timing)
        finally:
            self.metrics.observe_request(
                route_name, backend_name, status, time.perf_counter() - timing.start
            )
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def _serve(
        self, request: web.Request, candidates: list[Route], timing: Timing
    ) -> web.StreamResponse:
        route = candidates[0]
        t = timing.start
        body: bytes | AsyncIterator[bytes]
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            raise PayloadTooLarge(
                f"request body of {length} bytes exceeds {self.limits.max_body_bytes}"
            )
        cached = route.policy.exact.enabled  # a key needs the whole body, even on passthrough
        parsed = route.protocol != "passthrough" or len(candidates) > 1 or cached
        if parsed or (length is not None and length <= _STREAM_BODY_OVER):
            body = await self._read_body(request)
        else:
            body = self._stream_body(request)
        if cached and self.cache is not None and len(candidates) == 1 and isinstance(body, bytes):
            # Exact-cache fast path: these very bytes were parsed before and their answer is in L1.
            hit = self.cache.fast_hit(request, route.name, body, timing)
            if hit is not None:
                return hit
        call: Call | None = None
        if isinstance(body, bytes) and (route.protocol != "passthrough" or cached):
            parse = functools.partial(
                route.adapter.parse,
                request.method,
                request.path,
                request.query_string,
                request.headers.get("Content-Type", ""),
                body,
                request.headers,
            )
            # Megabytes of JSON take 100s of ms to decode: off the event loop, so health checks
            # and cache hits keep being answered meanwhile.
            call = await asyncio.to_thread(parse) if len(body) > _PARSE_INLINE else parse()
            if len(candidates) > 1:
                picked = Router.pick_by_model(candidates, call.model if call else None)
                if picked is None:
                    raise NotFound(
                        f"no route for model {call.model if call else None!r} on {request.path}"
                    )
                route = picked
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
                ),
                body=body
                if (isinstance(body, bytes) and body) or not isinstance(body, bytes)
                else None,
                policy=route.upstream,
            )

        # Exact-cache stage: between parse and dispatch; the stage calls the backend on a miss.
        rc = (
            self.cache.routes.get(route.name)
            if self.cache is not None and call is not None
            else None
        )
        if (
            rc is not None
            and call is not None
            and self.cache is not None
            and isinstance(body, bytes)
        ):
            return await self.cache.serve(
                request,
                rc,
                call,
                body,
                lambda: self._send(route, upstream_request()),
                lambda up, extra: self._respond(request, up, timing, extra),
                timing,
                t,
            )
        upstream = await self._send(route, upstream_request())
        t = timing.add("upstream", t)
        return await self._respond(request, upstream, timing)

    async def _send(self, route: Route, req: UpstreamRequest) -> UpstreamResponse:
        backend = self.backends[route.backend]
        self.tracing.inject(req)
        try:
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
        except ModelNotFound as exc:
            raise NotFound(str(exc)) from None
        except EngineError as exc:
            self.metrics.upstream_errors.labels(route.backend, type(exc).__name__).inc()
            raise GatewayError(f"local engine {route.backend} failed: {exc}") from None

    async def _read_body(self, request: web.Request) -> bytes:
        if request.content.is_eof():
            # The whole body came with the headers (the usual small POST): nothing to wait for.
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise PayloadTooLarge(
                    f"request body exceeds {self.limits.max_body_bytes} bytes"
                ) from None
        try:
            async with asyncio.timeout(self.limits.body_read_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLarge(
                f"request body exceeds {self.limits.max_body_bytes} bytes"
            ) from None
        except TimeoutError:
            raise RequestTimeout("the request body did not arrive in time") from None

    async def _stream_body(self, request: web.Request) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.content.iter_any():
            seen += len(chunk)
            if seen > self.limits.max_body_bytes:
                raise PayloadTooLarge(f"request body exceeds {self.limits.max_body_bytes} bytes")
            yield chunk

    async def _respond(
        self,
        request: web.Request,
        up: UpstreamResponse,
        timing: Timing,
        extra: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        headers = downstream_headers(up.headers)
        if extra:
            # The gateway's own headers (X-Cache, Age) replace any the upstream sent.
            names = {k.lower() for k in extra}
            headers = [(k, v) for k, v in headers if k.lower() not in names]
            headers.extend(extra.items())
        if up.body is not None or up.stream is None:
            headers.append(("Server-Timing", timing.header()))
            return web.Response(status=up.status, reason=up.reason, headers=headers, body=up.body)
        length = up.header("Content-Length")
        headers.append(("Server-Timing", timing.header()))
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
        if length is not None and length.isdigit():
            resp.content_length = int(length)
        stream = up.stream
        try:
            await resp.prepare(request)
            async for chunk in stream:
                await resp.write(chunk)
            await resp.write_eof()
        except UpstreamError as exc:
            # Headers are gone: the honest signal is a connection cut before the terminating chunk.
            log.warning("upstream stream broke mid-way: %s", exc)
            self.metrics.upstream_errors.labels("-", "stream_cut").inc()
            if request.transport is not None:
                request.transport.close()
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return resp

    def _error(self, protocol: str, err: GatewayError, timing: Timing) -> web.Response:
        headers = {
            "Content-Type": "application/json",
            "Server-Timing": timing.header(),
            **err.headers,
        }
        return web.Response(status=err.status, body=error_body(protocol, err), headers=headers)
