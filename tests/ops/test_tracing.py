"""Tracing: a SERVER span per request with one child per Server-Timing stage (SDK in-memory
exporter), the client's trace continued, our span sent upstream as traceparent; off by default."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.app import build_app
from gateway.config import Settings, TracingSettings
from gateway.state import STATE
from gateway.tracing import NoTracing, OtelTracing, build_tracing
from tests.conftest import base_config
from tests.ops.conftest import http
from tests.support.servers import ServerThread

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the optional `otel` extra")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def traced(upstream: ServerThread) -> Iterator[tuple[ServerThread, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings.model_validate(base_config(upstream.url))

    def make() -> Any:
        app = build_app(settings)
        app[STATE].pipeline.tracing = OtelTracing(provider, owns_provider=False)
        return app

    server = ServerThread(make).start()
    yield server, exporter
    server.stop()
    provider.shutdown()


def test_spans_per_stage_and_context_propagated_upstream(
    traced: tuple[ServerThread, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    parent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    status, _, body = http("GET", server.url + "/anything?x=1", headers={"traceparent": parent})
    assert status == 200
    sent = {k.lower(): v for k, v in json.loads(body)["headers"]}
    spans = exporter.get_finished_spans()
    (root,) = [
        s for s in spans if s.parent is not None and s.parent.span_id == int(CLIENT_SPAN, 16)
    ]
    assert root.context.trace_id == int(TRACE_ID, 16)  # the client's trace continues
    assert root.attributes is not None and root.kind.name == "SERVER"
    assert root.attributes["http.response.status_code"] == 200
    children = [
        s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
    ]
    assert [c.name for c in children] == ["upstream"]
    for child in children:
        times = [root.start_time, child.start_time, child.end_time, root.end_time]
        ints = [t for t in times if t is not None]
        assert len(ints) == 4 and ints == sorted(ints)  # the stage lies inside the request
    # Upstream sees our span as its parent, in the same trace, and only one traceparent.
    _version, trace_id, span_id, _flags = sent["traceparent"].split("-")
    assert trace_id == TRACE_ID and int(span_id, 16) == root.context.span_id


def test_parsed_route_has_a_parse_stage_span(
    traced: tuple[ServerThread, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    assert (
        http(
            "POST", server.url + "/v1/chat/completions", chat, {"Content-Type": "application/json"}
        )[0]
        == 200
    )
    names = {s.name for s in exporter.get_finished_spans()}
    assert {"parse", "upstream", "POST /v1/chat/completions"} <= names


def test_tracing_is_off_by_default_and_the_client_context_passes_through(
    gateway: ServerThread,
) -> None:
    assert isinstance(build_tracing(TracingSettings()), NoTracing)
    parent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    _, _, body = http("GET", gateway.url + "/anything", headers={"traceparent": parent})
    sent = {k.lower(): v for k, v in json.loads(body)["headers"]}
    assert sent["traceparent"] == parent


def test_enabled_tracing_builds_an_otlp_pipeline(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latentgate.tracing")
    tracing = build_tracing(
        TracingSettings(enabled=True, otlp_endpoint="http://127.0.0.1:9/v1/traces")
    )
    assert isinstance(tracing, OtelTracing)
    assert "OTLP/HTTP to http://127.0.0.1:9/v1/traces" in caplog.text
    tracing.shutdown()
