"""Hardening on a real `latentgate serve` process: per-client connection cap, slow-header clients
cut, header count and size limits, the admin API on its own listener, secrets kept out of logs."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.request
from collections.abc import Callable

from gateway.config import parse_settings
from gateway.redact import MASK, RedactingFilter, redact
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http
from tests.support.servers import GatewayProcess, ServerThread

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _recv_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _raw(port: int, request: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        return _recv_all(s, timeout)


def test_per_client_connection_cap(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    cfg = base_config(
        upstream.url, limits={"max_connections_per_client": 3, "cap_loopback_clients": True}
    )
    gw = gateway_process(cfg)
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=5) for _ in range(3)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        data = _recv_all(extra, 5)
        extra.close()
        assert data.startswith(b"HTTP/1.1 503"), data[:100]
        assert b"too many connections" in data
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert http("GET", gw.url + "/healthz")[0] == 200  # slots free again once clients leave
    metrics = http("GET", gw.url + "/metrics")[2].decode()
    assert 'latentgate_downstream_connections_refused_total{reason="per_client_cap"} 1.0' in metrics


def test_slow_header_client_is_cut(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_process(base_config(upstream.url, limits={"header_timeout_s": 1.0}))
    trickle = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
    started = time.monotonic()
    closed_after = None
    answer = b""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        for byte in trickle:  # one byte every 50 ms: ~12 s if nobody cut it
            # Read before each send: a byte sent after the server closed draws a reset, which
            # would discard the 408 still unread in our buffer.
            s.settimeout(0.05)
            try:
                chunk = s.recv(4096)
            except TimeoutError:
                chunk = None
            except ConnectionResetError:
                chunk = b""
            if chunk is not None:
                answer += chunk + _recv_all(s, 2)
                closed_after = time.monotonic() - started
                break
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None, "the gateway let a slowloris client hold the connection"
    assert closed_after < 6
    metrics = http("GET", gw.url + "/metrics")[2].decode()
    assert 'latentgate_downstream_connections_refused_total{reason="header_timeout"} 1.0' in metrics
    assert answer.startswith(b"HTTP/1.1 408") or not answer
    # A connection that never sends a byte is cut too, and normal clients are unaffected.
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        assert _recv_all(s, 4).startswith(b"HTTP/1.1 408")
    assert http("GET", gw.url + "/healthz")[0] == 200


def test_header_count_and_size_limits_answer_4xx(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    cfg = base_config(upstream.url, limits={"max_headers": 20, "max_header_bytes": 1024})
    gw = gateway_process(cfg)
    many = b"".join(f"X-H{i}: v\r\n".encode() for i in range(50))
    data = _raw(gw.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert data.split(b" ", 2)[1] in (b"400", b"431"), data[:120]
    big = b"X-Big: " + b"a" * 4000 + b"\r\n"
    data = _raw(gw.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
    assert data.split(b" ", 2)[1] in (b"400", b"431"), data[:120]
    assert http("GET", gw.url + "/v1/models")[0] == 200


def test_admin_api_on_its_own_listener(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
    tmp_sock_dir: str,
) -> None:
    sock = os.path.join(tmp_sock_dir, "admin.sock")
    cfg = base_config(
        upstream.url, admin={"token": ADMIN_TOKEN, "listener": {"name": "admin", "unix": sock}}
    )
    gw = gateway_process(cfg)
    assert http("GET", gw.url + "/admin/config", headers=AUTH)[0] == 404
    assert http("POST", gw.url + "/admin/reload", headers=AUTH)[0] == 404
    for probe in ("/healthz", "/readyz", "/metrics"):
        assert http("GET", gw.url + probe)[0] == 200

    def over_socket(path: str, method: str = "GET") -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            s.sendall(
                f"{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {ADMIN_TOKEN}"
                "\r\nConnection: close\r\n\r\n".encode()
            )
            return _recv_all(s, 10)

    config = over_socket("/admin/config")
    assert config.startswith(b"HTTP/1.1 200")
    assert ADMIN_TOKEN.encode() not in config  # masked in the effective config
    assert over_socket("/healthz").startswith(b"HTTP/1.1 200")
    assert over_socket("/v1/models").startswith(b"HTTP/1.1 404")  # no model traffic on admin
    # an admin path or method the API does not have is answered here, never forwarded upstream
    # (the upstream would get the admin token)
    wrong_method = over_socket("/admin/reload", "GET")
    assert wrong_method.startswith(b"HTTP/1.1 405") and b"Allow: POST" in wrong_method
    assert b'"method_not_allowed"' in wrong_method
    assert over_socket("/admin/anything", "DELETE").startswith(b"HTTP/1.1 404")
    assert over_socket("/admin/semantic").startswith(b"HTTP/1.1 404")  # no semantic stage here
    with urllib.request.urlopen(upstream.url + "/_test/stats", timeout=5) as r:
        seen = json.loads(r.read())["requests"]
    assert not [p for p in seen if p.startswith("/admin")], seen


def test_admin_paths_without_an_admin_listener_never_reach_the_upstream(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    gw = gateway_process(base_config(upstream.url, admin={"token": ADMIN_TOKEN}))
    assert http("GET", gw.url + "/admin/reload", headers=AUTH)[0] == 405
    assert http("POST", gw.url + "/admin/nope", headers=AUTH)[0] == 404
    assert http("GET", gw.url + "/admin", headers=AUTH)[0] == 404
    assert http("GET", gw.url + "/admin/config", headers=AUTH)[0] == 200
    with urllib.request.urlopen(upstream.url + "/_test/stats", timeout=5) as r:
        seen = json.loads(r.read())["requests"]
    assert not [p for p in seen if p.startswith("/admin")], seen


def test_default_config_puts_admin_on_loopback_away_from_the_main_port() -> None:
    from tests.support.servers import ROOT

    settings = parse_settings((ROOT / "config" / "latentgate.yaml").read_text(), environ={})
    admin = settings.admin.listener
    assert admin is not None and admin.host == "127.0.0.1"
    assert admin.port not in {lst.port for lst in settings.listeners}


def test_secrets_never_reach_the_logs(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    key = "sk-live-abcdefghijklmnop"
    cfg = base_config(upstream.url, logging={"level": "debug", "access_log": True})
    cfg["admin"] = {"token": "${LG_TEST_ADMIN_TOKEN}"}  # a secret from the environment
    gw = gateway_process(cfg, env={"LG_TEST_ADMIN_TOKEN": "env-token-987654321"})
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    h = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {key}",
        "X-Api-Key": key,
        "User-Agent": f"client Bearer {key}",
    }
    assert http("POST", gw.url + f"/v1/chat/completions?api_key={key}", chat, h)[0] == 200
    auth = {"Authorization": "Bearer env-token-987654321"}
    assert http("GET", gw.url + "/admin/config", headers=auth)[0] == 200
    http("GET", gw.url + "/admin/config", headers={"Authorization": "Bearer env-token-WRONG"})
    gw.stop()
    log = gw.log()
    assert "/v1/chat/completions" in log  # the access log did record the request
    assert key not in log
    assert "env-token-987654321" not in log


def test_redaction_filter_masks_messages_args_and_tracebacks() -> None:
    flt = RedactingFilter(["my-admin-token-xyz"])
    try:
        raise ValueError("token my-admin-token-xyz rejected")
    except ValueError:
        import sys

        rec = logging.LogRecord(
            "t",
            logging.ERROR,
            __file__,
            1,
            "hdr %s url %s",
            ("Authorization: Bearer abc123", "redis://:pw1234@r:6379"),
            sys.exc_info(),
        )
    assert flt.filter(rec)
    assert rec.getMessage() == f"hdr Authorization: {MASK} url redis://:{MASK}@r:6379"
    assert "my-admin-token-xyz" not in (rec.exc_text or "")
    assert redact("nothing secret here http://127.0.0.1:8000/v1") == (
        "nothing secret here http://127.0.0.1:8000/v1"
    )


def test_slow_headers_on_a_reused_connection_are_cut_by_the_idle_timeout(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    """After a first request, a trickled second one is bounded by limits.client_idle_timeout_s."""
    gw = gateway_process(base_config(upstream.url, limits={"client_idle_timeout_s": 1.5}))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        closed_after = None
        for byte in b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 300:
            try:
                s.sendall(bytes([byte]))
                s.settimeout(0.05)
                if s.recv(4096) == b"":
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None and closed_after < 6


def test_loopback_clients_are_not_capped_by_default(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    """A sidecar's application connects over loopback with a pool of its own: more
    connections than the per-client cap must all be served."""
    gw = gateway_process(base_config(upstream.url, limits={"max_connections_per_client": 3}))
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=5) for _ in range(6)]
    try:
        for s in held:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for s in held:
            assert s.recv(64).startswith(b"HTTP/1.1 200"), "a loopback connection was refused"
    finally:
        for s in held:
            s.close()
    metrics = http("GET", gw.url + "/metrics")[2].decode()
    assert 'latentgate_downstream_connections_refused_total{reason="per_client_cap"} 0.0' in metrics
