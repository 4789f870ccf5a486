"""`Expect` on model routes: 100-continue goes on to the answer; any other expectation is a 417
in the envelope of the route's clients (aiohttp's own was text/plain, `Unknown Expect: ...`)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.servers import ServerThread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
MESSAGES = {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


def _post(port: int, path: str, body: dict[str, Any], expect: str) -> tuple[int, str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", "Expect": expect}
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


def _envelope_message(path: str, doc: Any) -> str:
    if path == "/v1/messages":
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        return str(doc["error"]["message"])
    if path.startswith("/v2/"):
        assert isinstance(doc["error"], str)
        return str(doc["error"])
    assert doc["error"]["type"] == "expectation_failed" and doc["error"]["code"] == 417
    return str(doc["error"]["message"])


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES), ("/v2/models/m/infer", INFER)],
)
def test_an_unknown_expectation_is_a_417_in_the_routes_envelope(
    gw: ServerThread, upstream: ServerThread, path: str, body: dict[str, Any]
) -> None:
    status, ctype, raw = _post(gw.port, path, body, "200-ok")
    assert status == 417 and ctype.startswith("application/json")
    assert "200-ok" in _envelope_message(path, json.loads(raw))
    # never sent on: the client's expectation was refused
    conn = http.client.HTTPConnection("127.0.0.1", upstream.port, timeout=30)
    try:
        conn.request("GET", "/_test/stats")
        assert json.loads(conn.getresponse().read())["requests"].get(path, 0) == 0
    finally:
        conn.close()
    # 100-continue still goes on to the answer
    status, _, raw = _post(gw.port, path, body, "100-continue")
    assert status == 200, raw


def _head_only(port: int, path: str, length: int) -> bytes:
    """What the gateway answers to a request's head alone, Expect: 100-continue: the body is
    sent only after an interim 100 (as curl and requests' clients do)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (path.encode(), length)
        )
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 100"):
            return head
        length_line = next(
            ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")
        )
        want = int(length_line.split(b":")[1])
        while len(rest) < want and (chunk := s.recv(65536)):
            rest += chunk
        assert s.recv(1) == b""  # and the connection ends: the body never comes
        return head + b"\r\n\r\n" + rest


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_body_declared_over_the_limit_is_refused_before_the_100(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], path: str
) -> None:
    """Before, the gateway sent 100 Continue for any declared size, the client uploaded all of
    it, and only then got the 413 its Content-Length had already earned."""
    cfg = base_config(upstream.url, limits={"max_body_bytes": 4096})
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    answer = _head_only(gw.port, path, 1 << 30)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head
    doc = json.loads(body)
    message = doc["error"]["message"]
    assert "exceeds 4096" in message, doc
    # within the limit, the client is told to go on
    assert _head_only(gw.port, path, 4096).startswith(b"HTTP/1.1 100 ")
