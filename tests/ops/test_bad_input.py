"""Bad input at the HTTP level gets a clear 4xx with a JSON body, never a 500: raw sockets send
what clients' libraries refuse to (undecodable header bytes, absolute-form targets, dot segments),
through the real gateway to the real test upstream."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.app import build_app
from gateway.config import Settings
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import ServerThread
from tests.support.upstream import build_upstream

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}'


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    up = ServerThread(build_upstream).start()
    settings = Settings.model_validate(cache_config(up.url))
    server = ServerThread(lambda: build_app(settings)).start()
    yield server
    server.stop()
    up.stop()


def send(
    gw: ServerThread, target: bytes, headers: bytes = b"", body: bytes = b"", method: bytes = b""
) -> tuple[int, dict[str, str], Any]:
    verb = method or (b"POST" if body else b"GET")
    head = b"%s %s HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n" % (verb, target)
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=20) as s:
        s.sendall(head + headers + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_b, _, payload = data.partition(b"\r\n\r\n")
    lines = head_b.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    try:
        doc = json.loads(payload)
    except ValueError:
        doc = payload
    return status, hdrs, doc


def assert_json_error(status: int, doc: Any, expected: int) -> None:
    assert status == expected, doc
    assert isinstance(doc, dict) and "error" in doc, doc


def test_a_five_thousand_digit_integer_is_a_400(gw: ServerThread) -> None:
    huge = b"1" * 5000
    status, _, doc = send(gw, b"/v1/chat/completions", body=b'{"model":"m","n":%s}' % huge)
    assert_json_error(status, doc, 400)
    v2 = b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1],"data":[%s]}]}' % huge
    status, _, doc = send(gw, b"/v2/models/m/infer", body=v2)
    assert_json_error(status, doc, 400)
    status, _, doc = send(
        gw,
        b"/admin/cache/purge",
        headers=b"Authorization: Bearer %s\r\n" % ADMIN_TOKEN.encode(),
        body=b'{"route": %s}' % huge,
    )
    assert_json_error(status, doc, 400)


def test_non_utf8_headers_are_a_400_and_a_401_on_admin(gw: ServerThread) -> None:
    bad = b"Authorization: Bearer \xff\xfe\r\n"
    status, _, doc = send(gw, b"/v1/chat/completions", bad, CHAT)
    assert_json_error(status, doc, 400)
    status, _, doc = send(gw, b"/v1/chat/completions", b"X-Anything: caf\xe9\r\n", CHAT)
    assert_json_error(status, doc, 400)
    for path in (b"/admin/cache/stats", b"/admin/config", b"/admin/backends"):
        status, hdrs, doc = send(gw, path, bad)
        assert_json_error(status, doc, 401)
        assert hdrs["www-authenticate"] == "Bearer"
    # valid UTF-8 beyond ASCII is fine
    status, _, _ = send(gw, b"/v1/chat/completions", "X-Note: café\r\n".encode(), CHAT)
    assert status == 200


def test_absolute_form_is_served_as_its_origin_form(gw: ServerThread) -> None:
    status, _, doc = send(gw, b"http://elsewhere.example:9/echo/here?a=1")
    assert status == 200
    assert doc["raw_path"] == "/echo/here?a=1"  # what reached the upstream
    status, hdrs, doc = send(gw, b"http://gw/v1/chat/completions", body=CHAT)
    assert status == 200 and doc["object"] == "chat.completion" and "x-cache" in hdrs
    for target, method in ((b"*", b"OPTIONS"), (b"gw:443", b"CONNECT")):
        status, _, doc = send(gw, target, method=method)
        assert_json_error(status, doc, 400)


def test_dot_segments_are_removed_before_routing_and_upstream(gw: ServerThread) -> None:
    for target in (b"/v1/x/../chat/completions", b"/v1/x/%2e%2E/chat/./completions"):
        status, hdrs, doc = send(gw, target, body=CHAT)
        assert status == 200 and doc["object"] == "chat.completion", (target, doc)
        assert "x-cache" in hdrs  # the chat route's cache served it
    status, _, doc = send(gw, b"/echo/a/../b/./c?q=/../x")
    assert doc["raw_path"] == "/echo/b/c?q=/../x"  # the query is not a path
    status, _, doc = send(gw, b"/v1/x/..%2Fchat/completions", body=CHAT)
    assert_json_error(status, doc, 400)
    # the admin API is not reachable around its guard, nor anything above the root
    status, _, doc = send(gw, b"/v1/../admin/cache/stats")
    assert_json_error(status, doc, 401)
    status, _, doc = send(gw, b"/../../echo/top")
    assert doc["raw_path"] == "/echo/top"


def _v2(shape: list[int], data: list[Any]) -> bytes:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}
    return json.dumps(body).encode()


def test_v2_shape_products_do_not_overflow(gw: ServerThread) -> None:
    status, _, doc = send(gw, b"/v2/models/m/infer", body=_v2([7, 7905747460161236407], [1.0]))
    assert status == 400 and "error" in doc
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [7, 7905747460161236407],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    status, _, doc = send(
        gw,
        b"/v2/models/m/infer",
        b"Inference-Header-Content-Length: %d\r\n" % len(header),
        header + b"\x00\x00\x80\x3f",
    )
    assert status == 400 and "error" in doc


def test_the_remembered_body_shortcut_checks_the_binary_header_like_a_fresh_parse(
    gw: ServerThread,
) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    body = header + b"\x00\x00\x80\x3f"
    good = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    assert send(gw, b"/v2/models/m/infer", good, body)[0] == 200
    status, hdrs, _ = send(gw, b"/v2/models/m/infer", good, body)
    assert status == 200 and hdrs["x-cache"] == "hit"
    for bad in (b"abc", b"99999", b"-1"):
        status, _, doc = send(
            gw, b"/v2/models/m/infer", b"Inference-Header-Content-Length: %s\r\n" % bad, body
        )
        assert status == 400 and "error" in doc, bad
