"""`admin.metrics: admin_listener`: /metrics answers on the admin listener alone. Its per-route
counters (requests, cache hits, semantic budgets) describe every tenant's traffic in aggregate;
a multi-tenant deployment keeps them off the listener its clients reach. The default keeps
/metrics on every listener, as before."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable

import pytest
import yaml

from gateway.config import ConfigError, parse_settings
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http
from tests.support.servers import GatewayProcess, ServerThread


def _get_over(sock_path: str, path: str) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock_path)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_metrics_on_the_admin_listener_alone(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess], tmp_sock_dir: str
) -> None:
    sock = os.path.join(tmp_sock_dir, "admin.sock")
    admin = {
        "token": ADMIN_TOKEN,
        "listener": {"name": "admin", "unix": sock},
        "metrics": "admin_listener",
    }
    gw = gateway_process(base_config(upstream.url, admin=admin))
    status, _, body = http("GET", gw.url + "/metrics")
    assert status == 404
    assert json.loads(body)["error"]["type"] == "not_found"
    for probe in ("/healthz", "/readyz"):  # the other probes stay where they were
        assert http("GET", gw.url + probe)[0] == 200
    there = _get_over(sock, "/metrics")
    assert there.startswith(b"HTTP/1.1 200"), there[:200]
    assert b"latentgate_" in there


def test_admin_listener_metrics_need_an_admin_listener() -> None:
    cfg = base_config("http://127.0.0.1:9", admin={"metrics": "admin_listener"})
    with pytest.raises(ConfigError, match=r"admin_listener needs admin\.listener"):
        parse_settings(yaml.safe_dump(cfg))
