"""`Expect` on model routes: 100-continue goes on to the answer; any other expectation is a 417
in the envelope of the route's clients (aiohttp's own was text/plain, `Unknown Expect: ...`)."""

from __future__ import annotations

import http.client
import json
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
