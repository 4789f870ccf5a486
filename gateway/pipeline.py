"""One request end to end: route → read and parse → dispatch → respond, with Server-Timing.

Cache stages plug in between parse and dispatch; nothing here talks to Redis or runs a model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping

from aiohttp import web
from multidict import CIMultiDict

from backends import (
    Backend,
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

log = logging.getLogger("latentgate.pipeline")

# Passthrough bodies larger than this (or of unknown length) stream through instead of buffering.
_STREAM_BODY_OVER = 1 << 20


class Timing:
    """Stage durations for Server-Timing, in insertion order."""

    __slots__ = ("start", "stages")

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
        self, router: Router, backends: Mapping[str, Backend], metrics: Metrics, limits: LimitSettings,
        cache: CacheStage | None = None,
    ) -> None:
        self.cache = cache
        self.router = router
        self.backends = backends
        self.metrics = metrics
        self.limits = limits
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing = Timing()
        self.in_flight += 1
        self.idle.clear()
        self.metrics.in_flight.inc()
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
            self.metrics.observe_request(route_name, backend_name, status, time.perf_counter() - timing.start)
            self.metrics.in_flight.dec()
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def _serve(self, request: web.Request, candidates: list[Route], timing: Timing) -> web.StreamResponse:
        route = candidates[0]
        t = timing.start
        body: bytes | AsyncIterator[bytes]
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds {self.limits.max_body_bytes}")
        cached = route.policy.exact.enabled  # a key needs the whole body, even on passthrough
        parsed = route.protocol != "passthrough" or len(candidates) > 1 or cached
        if parsed or (length is not None and length <= _STREAM_BODY_OVER):
            body = await self._read_body(request)
        else:
            body = self._stream_body(request)
        call: Call | None = None
        if isinstance(body, bytes) and (route.protocol != "passthrough" or cached):
            call = route.adapter.parse(
                request.method, request.path, request.query_string,
                request.headers.get("Content-Type", ""), body, request.headers,
            )
            if len(candidates) > 1:
                picked = Router.pick_by_model(candidates, call.model if call else None)
                if picked is None:
                    raise NotFound(f"no route for model {call.model if call else None!r} on {request.path}")
                route = picked
            t = timing.add("parse", t)
        up_req = UpstreamRequest(
            method=request.method,
            path_qs=request.raw_path,
            headers=upstream_headers(
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers],
                client_ip=request.remote, proto=request.scheme, host=request.host,
                keep_length=not isinstance(body, bytes),
            ),
            body=body if (isinstance(body, bytes) and body) or not isinstance(body, bytes) else None,
        )
        # Exact-cache stage: between parse and dispatch; the stage calls the backend on a miss.
        rc = self.cache.routes.get(route.name) if self.cache is not None and call is not None else None
        if rc is not None and call is not None and self.cache is not None:
            return await self.cache.serve(
                request, rc, call, lambda: self._send(route, up_req),
                lambda up, extra: self._respond(request, up, timing, extra), timing, t,
            )
        upstream = await self._send(route, up_req)
        t = timing.add("upstream", t)
        return await self._respond(request, upstream, timing)

    async def _send(self, route: Route, req: UpstreamRequest) -> UpstreamResponse:
        backend = self.backends[route.backend]
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

    async def _read_body(self, request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(self.limits.body_read_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLarge(f"request body exceeds {self.limits.max_body_bytes} bytes") from None
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
        self, request: web.Request, up: UpstreamResponse, timing: Timing,
        extra: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        headers = CIMultiDict(downstream_headers(up.headers))
        if extra:
            headers.update(extra)
        if up.body is not None or up.stream is None:
            headers["Server-Timing"] = timing.header()
            return web.Response(status=up.status, reason=up.reason, headers=headers, body=up.body)
        length = up.header("Content-Length")
        headers["Server-Timing"] = timing.header()
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
        headers = {"Content-Type": "application/json", "Server-Timing": timing.header(), **err.headers}
        return web.Response(status=err.status, body=error_body(protocol, err), headers=headers)
