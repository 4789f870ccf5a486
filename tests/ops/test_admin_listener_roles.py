"""What the admin listener keeps to itself and what it refuses. `admin.metrics:
admin_listener`: /metrics answers there alone (its per-route counters describe every tenant's
traffic in aggregate; a multi-tenant deployment keeps them off the listener its clients reach;
the default keeps /metrics on every listener, as before). And a model path there is a 404,
`Expect` or not."""

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


def _head_over(sock_path: str, head: bytes) -> bytes:
    """What the listener answers to a request's head alone (the body waits for a 100)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock_path)
        s.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
    return data


@pytest.mark.parametrize(
    ("expect", "length"),
    [("100-continue", 10), ("100-continue", 1 << 30), ("200-ok", 10)],
    ids=["continue", "continue-over-the-limit", "unknown-expectation"],
)
def test_a_model_path_with_expect_on_the_admin_listener_is_a_404(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
    tmp_sock_dir: str,
    expect: str,
    length: int,
) -> None:
    """The admin listener serves no model traffic: a model path there is a 404. With `Expect`,
    aiohttp runs the expect handler before the middleware that says so: the client was told
    100 Continue, 413 or 417 as if the path were served there."""
    sock = os.path.join(tmp_sock_dir, "admin.sock")
    admin = {"token": ADMIN_TOKEN, "listener": {"name": "admin", "unix": sock}}
    gateway_process(base_config(upstream.url, admin=admin))
    answer = _head_over(
        sock,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\n"
        b"Expect: %s\r\nContent-Length: %d\r\n\r\n" % (expect.encode(), length),
    )
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
