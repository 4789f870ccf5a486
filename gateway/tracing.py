"""OpenTelemetry tracing (the optional `otel` extra; off unless `tracing.enabled`): one SERVER span
per request, one child span per Server-Timing stage, and W3C trace context sent upstream.

With tracing off, or the extra missing (a visible warning at start), NoTracing does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from backends import UpstreamRequest
from gateway.config import TracingSettings

if TYPE_CHECKING:
    from gateway.timing import Timing

log = logging.getLogger("latentgate.tracing")

_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


class Tracing(Protocol):
    def start(self, request: web.Request) -> Any: ...
    def inject(self, req: UpstreamRequest) -> None: ...
    def finish(self, handle: Any, timing: Timing, status: int) -> None: ...
    def shutdown(self) -> None: ...


class NoTracing:
    def start(self, request: web.Request) -> Any:
        return None

    def inject(self, req: UpstreamRequest) -> None:
        return None

    def finish(self, handle: Any, timing: Timing, status: int) -> None:
        return None

    def shutdown(self) -> None:
        return None


class OtelTracing:
    """Spans through an OTel TracerProvider (tests pass one with an in-memory exporter)."""

    def __init__(self, provider: Any, owns_provider: bool = True) -> None:
        from opentelemetry import context, propagate, trace

        self._context = context
        self._propagate = propagate
        self._trace = trace
        self._provider = provider
        self._owns = owns_provider
        self._tracer = provider.get_tracer("latentgate")

    def start(self, request: web.Request) -> Any:
        parent = self._propagate.extract(dict(request.headers))
        span = self._tracer.start_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            start_time=time.time_ns(),
            attributes={"http.request.method": request.method, "url.path": request.path},
        )
        token = self._context.attach(self._trace.set_span_in_context(span, parent))
        return span, token, time.time_ns(), time.perf_counter()

    def inject(self, req: UpstreamRequest) -> None:
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        if carrier:
            # Our span is the upstream's parent now; the client's context is its ancestor.
            req.headers = [(k, v) for k, v in req.headers if k.lower() not in _TRACE_HEADERS]
            req.headers.extend(carrier.items())

    def finish(self, handle: Any, timing: Timing, status: int) -> None:
        if handle is None:
            return
        span, token, wall_ns, perf0 = handle
        # Stage spans are laid end to end from the request's start, as Server-Timing reports them.
        offset_ns = wall_ns + int((timing.start - perf0) * 1e9)
        ctx = self._trace.set_span_in_context(span)
        for name, seconds in timing.stages:
            end_ns = offset_ns + int(seconds * 1e9)
            child = self._tracer.start_span(name, context=ctx, start_time=offset_ns)
            child.end(end_time=end_ns)
            offset_ns = end_ns
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()
        self._context.detach(token)

    def shutdown(self) -> None:
        if self._owns:
            self._provider.shutdown()


def build_tracing(settings: TracingSettings) -> Tracing:
    if not settings.enabled:
        return NoTracing()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
    except ImportError:
        log.warning(
            "tracing.enabled is set but the `otel` extra is not installed "
            "(pip install 'latentgate[otel]'): tracing is OFF"
        )
        return NoTracing()
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBasedTraceIdRatio(settings.sample_ratio),
    )
    exporter = (
        OTLPSpanExporter(endpoint=settings.otlp_endpoint)
        if settings.otlp_endpoint
        else OTLPSpanExporter()
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info(
        "tracing on: OTLP/HTTP to %s, sample ratio %.2f",
        settings.otlp_endpoint or "the OTEL_EXPORTER_OTLP_* default",
        settings.sample_ratio,
    )
    return OtelTracing(provider)
