"""Pool and route policy settings: defaults that users rely on and errors that name the key."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, Settings, parse_settings
from gateway.routing import Route

BASE = """
backends:
  pool:
    kind: remote
    replicas: [http://127.0.0.1:1, http://127.0.0.1:2]
{backend_extra}
routes:
  - name: chat
    match: {{path: /v1/chat/completions}}
    protocol: openai
    backend: pool
{route_extra}
  - name: rest
    match: {{prefix: /}}
    backend: pool
"""


def _settings(backend_extra: str = "", route_extra: str = "") -> Settings:
    return parse_settings(BASE.format(backend_extra=backend_extra, route_extra=route_extra))


def test_defaults_inference_routes_idempotent_passthrough_by_method() -> None:
    s = _settings()
    pool = s.backends["pool"]
    assert pool.balancer.policy == "least_request" and pool.health_check is None
    assert pool.outlier.max_ejection_percent == 10 and pool.retry_budget.percent == 20
    chat, rest = (Route.from_settings(r, None) for r in s.routes)  # type: ignore[arg-type]
    assert chat.upstream.idempotent is True and chat.upstream.retries.max == 2
    assert rest.upstream.idempotent is None  # the pool decides by HTTP method


@pytest.mark.parametrize(
    ("backend_extra", "route_extra", "where", "says"),
    [
        (
            "",
            "    upstream: {hedge: {}}",
            "routes.0.upstream.hedge",
            "after_ms or after_percentile",
        ),
        (
            "    balancer: {policy: weighted, weights: [1]}",
            "",
            "backends.pool",
            "one positive weight",
        ),
        (
            "    outlier: {max_ejection_percent: 150}",
            "",
            "backends.pool.outlier.max_ejection_percent",
            "less than or equal to 100",
        ),
        (
            "",
            "    upstream: {retries: {tries: 3}}",
            "routes.0.upstream.retries.tries",
            "unknown key",
        ),
    ],
)
def test_bad_policy_names_the_key(
    backend_extra: str, route_extra: str, where: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(backend_extra, route_extra)
    issue = info.value.issues[0]
    assert issue.path == where and says in issue.message, issue


GRPC = """
listeners:
  - {{name: grpc, protocol: grpc, host: 127.0.0.1, port: 0}}
backends:
  g:
    kind: remote
    replicas: {replicas}
{backend_extra}
routes:
  - name: infer
    match: {{prefix: /inference.GRPCInferenceService/}}
    protocol: {protocol}
    backend: g
"""


def _grpc(replicas: str, protocol: str = "grpc", backend_extra: str = "") -> Settings:
    return parse_settings(
        GRPC.format(replicas=replicas, protocol=protocol, backend_extra=backend_extra)
    )


def test_grpc_pools_check_serverready_by_default() -> None:
    s = _grpc("[grpc://127.0.0.1:1, grpc+unix:/tmp/m.sock]", backend_extra="    health_check: {}")
    pool = s.backends["g"]
    assert pool.kind == "remote" and pool.wire == "grpc"
    assert pool.health_check is not None
    assert pool.health_check.path == "/inference.GRPCInferenceService/ServerReady"


@pytest.mark.parametrize(
    ("replicas", "protocol", "where", "says"),
    [
        ("[grpc://127.0.0.1:1, http://127.0.0.1:2]", "grpc", "backends.g.replicas", "not both"),
        ("['grpc+unix:']", "grpc", "backends.g.replicas", "names no socket path"),
        ("[grpc://127.0.0.1:1]", "v2", "routes.0.protocol", "speaks gRPC; give the route"),
    ],
)
def test_bad_grpc_settings_say_why(replicas: str, protocol: str, where: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _grpc(replicas, protocol)
    issue = info.value.issues[0]
    assert issue.path == where and says in issue.message, issue


@pytest.mark.parametrize("url", ["http://svc:hunter2@127.0.0.1:1", "http://svc@127.0.0.1:1"])
def test_a_replica_url_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    """Never sent upstream, and they would show in clear in /metrics, /readyz and errors."""
    text = BASE.replace("[http://127.0.0.1:1, http://127.0.0.1:2]", f"[{url}]").format(
        backend_extra="", route_extra=""
    )
    with pytest.raises(ConfigError) as info:
        parse_settings(text)
    issue = info.value.issues[0]
    assert issue.path.startswith("backends.pool.replicas"), issue
    assert "user or password" in issue.message
    assert "hunter2" not in str(info.value) and "svc@" not in str(info.value)
