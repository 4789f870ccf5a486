"""Bad input at the HTTP level gets a clear 4xx with a JSON body, never a 500: raw sockets send
what clients' libraries refuse to (undecodable header bytes, absolute-form targets, dot segments),
through the real gateway to the real test upstream."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.integration.cache.conftest import ADMIN_TOKEN, anthropic_route, cache_config
from tests.support.servers import ServerThread
from tests.support.upstream import build_upstream

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}'


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    up = ServerThread(build_upstream).start()
    cfg = cache_config(up.url)
    cfg["routes"].insert(0, anthropic_route())
    settings = Settings.model_validate(cfg)
    server = ServerThread(lambda: build_app(settings), runner_kwargs=SERVER_OPTIONS).start()
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


@pytest.mark.parametrize("depth", [200, 600, 900, 1100])
def test_deeply_nested_bodies_are_a_400_on_every_cached_protocol(
    gw: ServerThread, depth: int
) -> None:
    """Depths the JSON decoder takes (to ~990) but a walk over the body (the cache key's) may
    not: a JSON 400 saying so, or served when shallow enough, never a 500."""
    deep = b"[" * depth + b"]" * depth
    bodies = {
        b"/v1/chat/completions": b'{"model":"m","temperature":0,"messages":[{"role":"user",'
        b'"content":"hi"}],"metadata":%s}' % deep,
        b"/v1/messages": b'{"model":"m","max_tokens":5,"temperature":0,"messages":[{"role":'
        b'"user","content":"hi"}],"tools":%s}' % deep,
        b"/v2/models/m/infer": b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1],'
        b'"data":[1]}],"parameters":{"p":%s}}' % deep,
    }
    for target, body in bodies.items():
        status, _, doc = send(gw, target, body=body)
        if status != 200:
            assert_json_error(status, doc, 400)
            err = doc["error"]  # v2 says it as a string, OpenAI and Anthropic in an object
            assert "nested too deeply" in (err if isinstance(err, str) else err["message"]), doc
        else:
            assert isinstance(doc, dict) and depth < 1000, (target, depth)  # answered


def test_a_lone_surrogate_in_an_admin_body_is_a_400(gw: ServerThread) -> None:
    auth = b"Authorization: Bearer %s\r\n" % ADMIN_TOKEN.encode()
    for body in (
        b'{"tenant": "\\ud800"}',
        b'{"route": "r\\udfff"}',
        b'{"tenant": {"Authorization": "\\ud800"}}',
    ):
        status, _, doc = send(gw, b"/admin/cache/purge", headers=auth, body=body)
        assert_json_error(status, doc, 400)
        assert "Unicode" in doc["error"]["message"], body
    # and a body nested as deep as the JSON decoder takes is a 400 too, not a 500
    deep = b'{"route": %s}' % (b"[" * 900 + b"]" * 900)
    status, _, doc = send(gw, b"/admin/cache/purge", headers=auth, body=deep)
    assert_json_error(status, doc, 400)
    # a body that does not decode as its Content-Encoding says is the client's 400, not a 500
    # (every admin body is read by codings.read_body)
    gz = auth + b"Content-Encoding: gzip\r\n"
    status, _, doc = send(gw, b"/admin/cache/purge", headers=gz, body=b"garbage")
    assert_json_error(status, doc, 400)
    assert "does not decode" in doc["error"]["message"]


@pytest.mark.parametrize("path", [b"/any/echo", b"/v1/chat/completions"])
def test_a_transfer_coding_besides_chunked_is_a_501(gw: ServerThread, path: bytes) -> None:
    """aiohttp reads "gzip, chunked" as chunked and would pass the body on still compressed
    under no label at all (Transfer-Encoding is hop-by-hop): refused as RFC 9112 6.1 says."""
    packed = gzip.compress(CHAT)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed)
    for coding, expected in ((b"gzip, chunked", 501), (b"chunked", None)):
        status, _, doc = _send_chunked(gw, path, coding, chunked if expected else _chunk(CHAT))
        if expected is None:
            assert status == 200, doc
        else:
            assert_json_error(status, doc, expected)
            assert "gzip" in doc["error"]["message"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


def _send_chunked(gw: ServerThread, path: bytes, coding: bytes, body: bytes) -> Any:
    head = (
        b"POST %s HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: %s\r\n\r\n" % (path, coding)
    )
    with socket.create_connection(("127.0.0.1", gw.port), timeout=20) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_b, _, payload = data.partition(b"\r\n\r\n")
    status = int(head_b.split(b" ")[1])
    if b"transfer-encoding: chunked" in head_b.lower():
        payload = payload.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    try:
        return status, {}, json.loads(payload)
    except ValueError:
        return status, {}, payload


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


def test_a_v2_body_of_many_inputs_is_parsed_in_linear_time(gw: ServerThread) -> None:
    """Each input's name was checked against every input before it: 16,000 inputs (1 MB)
    took 85 s of CPU to parse, 250,000 (16 MiB) hours. A name twice is found at once now."""
    many = [{"name": f"x{i}", "datatype": "FP32", "shape": [1], "data": [1.0]} for i in range(2047)]
    body = json.dumps({"inputs": [*many, many[0]]}).encode()
    status, _, doc = send(gw, b"/v2/models/m/infer", body=body)
    assert status == 400 and doc["error"] == "input 'x0' appears more than once", doc


@pytest.mark.parametrize("what", ["inputs", "outputs"])
def test_a_v2_body_naming_more_tensors_than_the_route_takes_is_a_413(
    gw: ServerThread, what: str
) -> None:
    """Past limits.max_items named tensors (2,048) a body is refused before its tensors are
    read: 250,000 inputs in 16 MiB were seconds of CPU even when parsed in linear time, and
    50,000 outputs asked of a local model hundreds of MB of answer."""
    one = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    tensors = [{**one, "name": f"x{i}"} for i in range(40_000)]
    doc = {"inputs": tensors} if what == "inputs" else {"inputs": [one], "outputs": tensors}
    status, _, answer = send(gw, b"/v2/models/m/infer", body=json.dumps(doc).encode())
    assert status == 413, answer
    assert answer["error"] == (
        f"the request names 40000 {what}; this route takes at most 2048 per request"
    )


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


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT64", [1.5]), ("INT32", ["1"]), ("UINT8", [True]), ("FP32", ["0.5"]), ("BOOL", [1])],
)
def test_v2_json_data_of_another_type_is_a_400_not_coerced(
    gw: ServerThread, datatype: str, data: list[Any]
) -> None:
    """1.5 sent as INT64 is not the 1 numpy would make of it: coerced, it shared the key (and
    the cached answer) of a request that sent 1."""
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": data}]}
    status, _, body = send(gw, b"/v2/models/m/infer", body=json.dumps(doc).encode())
    assert status == 400, body
    assert f"does not fit datatype {datatype}" in body["error"]  # (v2 errors are strings)
    fine = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1, -2]}]}
    assert send(gw, b"/v2/models/m/infer", body=json.dumps(fine).encode())[0] == 200


@pytest.mark.parametrize("shape", [[True], [1, False], [1.0], [-1]])
def test_a_v2_shape_of_anything_but_non_negative_integers_is_a_400(
    gw: ServerThread, shape: list[Any]
) -> None:
    """`[true]` passed as 1 (a bool is an int to Python): no model server takes it, and it was
    keyed apart from `[1]`."""
    status, _, body = send(gw, b"/v2/models/m/infer", body=_v2(shape, [1.0]))
    assert status == 400, body
    assert "'shape' must be an array of non-negative integers" in body["error"]
    assert send(gw, b"/v2/models/m/infer", body=_v2([1], [1.0]))[0] == 200


def _binary_infer(gw: ServerThread, inputs: list[dict[str, Any]], data: bytes) -> Any:
    header = json.dumps({"inputs": inputs}).encode()
    hlen = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    return send(gw, b"/v2/models/m/infer", hlen, header + data)


def test_v2_binary_bytes_no_input_accounts_for_are_a_400(gw: ServerThread) -> None:
    """Bytes after the last input's binary_data_size were not in the key but went upstream:
    the request was answered from the entry of the body without them (before: 200, a hit)."""
    elem = b"\x05\x00\x00\x00hello"
    text = {"name": "t", "datatype": "BYTES", "shape": [1]}
    text["parameters"] = {"binary_data_size": len(elem)}
    status, _, doc = _binary_infer(gw, [text], elem)
    assert status == 200, doc
    for extra in (b"\x03\x00\x00\x00abc", b"J"):
        status, hdrs, doc = _binary_infer(gw, [text], elem + extra)
        assert status == 400 and "x-cache" not in hdrs, doc
        assert f"{len(extra)} bytes after the inference header" in doc["error"]
    # and binary data with no input claiming any of it (all JSON `data`)
    inline = {"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}
    status, _, doc = _binary_infer(gw, [inline], elem)
    assert status == 400 and "no input's binary_data_size" in doc["error"], doc


def test_a_v2_binary_data_size_of_true_is_a_400(gw: ServerThread) -> None:
    """`true` passed as 1 (a bool is an int to Python) and shared the key of 1."""
    tensor = {"name": "x", "datatype": "UINT8", "shape": [1]}
    for size, expected in ((True, 400), (1.0, 400), (1, 200)):
        tensor["parameters"] = {"binary_data_size": size}
        status, _, doc = _binary_infer(gw, [tensor], b"\x07")
        assert status == expected, (size, doc)
        if expected == 400:
            assert "binary_data_size does not match the body" in doc["error"]


def test_the_binary_header_length_is_ascii_digits_only(gw: ServerThread) -> None:
    """Python's int() read "12_3" and "١٢٣" as 123, where Triton's atoi reads 12 and 0: the key
    split the body at one place, the upstream at another (before: 200, stored)."""
    tensor = {"name": "x", "datatype": "UINT8", "shape": [1]}
    tensor["parameters"] = {"binary_data_size": 1}
    header = json.dumps({"inputs": [tensor]}).encode()
    n = str(len(header))
    arabic = "".join(chr(0x660 + int(d)) for d in n)
    for value in (f"{n[:-1]}_{n[-1]}", arabic, f"+{n}", f"{n}.0", f"0x{len(header):x}"):
        hlen = f"Inference-Header-Content-Length: {value}\r\n".encode()
        status, hdrs, doc = send(gw, b"/v2/models/m/infer", hlen, header + b"\x09")
        assert status == 400 and "x-cache" not in hdrs, (value, doc)
        assert "must be an integer (ASCII digits)" in doc["error"], doc
    hlen = f"Inference-Header-Content-Length: {n}\r\n".encode()
    assert send(gw, b"/v2/models/m/infer", hlen, header + b"\x09")[0] == 200


def test_a_purge_of_a_route_no_route_is_named_is_a_400(gw: ServerThread) -> None:
    """Before: a misspelt route purged nothing and answered 200, which read as done."""
    auth = b"Authorization: Bearer %s\r\n" % ADMIN_TOKEN.encode()
    status, _, doc = send(gw, b"/admin/cache/purge", headers=auth, body=b'{"route": "caht"}')
    assert_json_error(status, doc, 400)
    assert "'caht'" in doc["error"]["message"] and doc["error"]["param"] == "route"
    routes = doc["error"]["message"].split("the routes are: ")[1].split(", ")
    assert routes and all(r for r in routes)
    body = b'{"route": "%s"}' % routes[0].encode()
    status, _, doc = send(gw, b"/admin/cache/purge", headers=auth, body=body)
    assert status == 200 and isinstance(doc["purged"]["memory"], int), doc
