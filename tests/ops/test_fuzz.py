"""Hostile input at every parsed route and at the admin API (hypothesis): the gateway never answers
500 of its own and never hangs. Routes point at the real test upstream; an upstream's own error
passes through (Server-Timing then has an `upstream` stage) and is not counted against the gateway.

Sized for CI: about 3,500 requests in total. LATENTGATE_FUZZ_EXAMPLES scales every test (the
larger run: bench/fuzz_run.py), and LATENTGATE_FUZZ_REPORT names a file that gets the totals.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN
from tests.support.servers import ServerThread
from tests.support.upstream import build_upstream

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "admin-openapi.yaml"
FUZZ = settings(
    max_examples=int(os.environ.get("LATENTGATE_FUZZ_EXAMPLES", "500")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
content_types = st.sampled_from(
    [
        "application/json",
        "application/msgpack",
        "application/x-msgpack",
        "text/plain",
        "",
        "application/json; charset=utf-8",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
    ]
)


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.gateway_500s = 0
        self.upstream_500s = 0
        self.sent = 0

    def send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        self.sent += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()  # a hang raises TimeoutError and fails the test
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def check(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
        status, hdrs, data = self.send(method, path, body, headers)
        forwarded = "upstream;dur" in hdrs.get("server-timing", "")
        if status >= 500 and forwarded:
            self.upstream_500s += 1
            return status
        assert status != 500, (
            f"gateway 500 for {method} {path} {headers} {body!r:.200}: {data!r:.300}"
        )
        assert status < 600
        if status >= 400:
            assert data, "an error answer must have a body"
        return status


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    up = ServerThread(lambda: build_upstream("fuzz")).start()
    cfg = base_config(up.url, admin={"token": ADMIN_TOKEN}, limits={"max_body_bytes": 65536})
    cfg["backends"]["upstream"]["timeouts"] = {"connect": 1, "read": 5, "total": 10}
    for route in cfg["routes"]:  # hostile input through the exact-cache stage too
        if route["name"] in ("chat", "completions", "embeddings"):
            route["cache"] = {"exact": {"enabled": True, "tiers": ["memory"]}}
        if route["name"] == "chat":  # ... and the semantic one (and its admin endpoints)
            route["cache"]["semantic"] = {"enabled": True}
    settings_ = Settings.model_validate(cfg)
    gw = ServerThread(lambda: build_app(settings_), runner_kwargs=SERVER_OPTIONS).start()
    c = Client(gw.port)
    yield c
    # Still alive and healthy after everything above.
    assert c.send("GET", "/healthz", None, {})[0] == 200
    if report := os.environ.get("LATENTGATE_FUZZ_REPORT"):
        with open(report, "w") as f:
            json.dump({"requests": c.sent, "gateway_5xx": c.gateway_500s,
                       "upstream_5xx": c.upstream_500s}, f)  # fmt: skip
    gw.stop()
    up.stop()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


openai_bodies = st.one_of(
    json_values.map(_json_bytes),
    st.fixed_dictionaries(
        {
            "model": json_values,
            "messages": st.lists(
                st.dictionaries(
                    st.sampled_from(["role", "content", "name", "tool_calls"]),
                    json_values,
                    max_size=4,
                ),
                max_size=4,
            ),
        },
        optional={
            "stream": json_values,
            "temperature": json_values,
            "n": json_values,
            "prompt": json_values,
            "input": json_values,
            "max_tokens": json_values,
        },
    ).map(_json_bytes),
    st.binary(max_size=300),
    st.just(b""),
    st.just(b"{" * 5000),
    st.integers(4000, 6000).map(lambda n: b'{"model":"m","input":"x","n":' + b"7" * n + b"}"),
)


@FUZZ
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
    body=openai_bodies,
    ctype=content_types,
    method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
)
def test_openai_routes(client: Client, path: str, body: bytes, ctype: str, method: str) -> None:
    client.check(method, path, body, {"Content-Type": ctype} if ctype else {})


v2_inputs = st.lists(
    st.fixed_dictionaries(
        {
            "name": json_values | st.text(max_size=8),
            "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP16", "UINT8", "nope"])
            | json_values,
            "shape": st.lists(st.integers(-3, 6), max_size=4)
            | st.lists(st.integers(0, 2**64), max_size=3)
            | json_values,
            "data": json_values,
        },
        optional={"parameters": json_values},
    ),
    max_size=3,
)


@FUZZ
@given(
    inputs=v2_inputs,
    model=st.text(st.characters(min_codepoint=0x30, max_codepoint=0x7A), min_size=1, max_size=10),
    tail=st.binary(max_size=64),
    hlen=st.none() | st.integers(-10, 10_000).map(str) | header_text,
    binary_size=st.none() | st.integers(-5, 100),
)
def test_v2_infer(
    client: Client,
    inputs: list[dict[str, Any]],
    model: str,
    tail: bytes,
    hlen: str | None,
    binary_size: int | None,
) -> None:
    if binary_size is not None and inputs:
        inputs[0]["parameters"] = {"binary_data_size": binary_size}
    header = _json_bytes({"inputs": inputs})
    headers = {"Content-Type": "application/octet-stream" if hlen else "application/json"}
    if hlen is not None:
        headers["Inference-Header-Content-Length"] = hlen
    body = header + tail if hlen is not None else header
    client.check("POST", f"/v2/models/{model}/infer", body, headers)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#?%"), max_size=40
    ),
    query=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#"), max_size=30
    ),
    body=st.binary(max_size=200),
    extra=st.dictionaries(
        st.sampled_from(
            [
                "X-Test-Status",
                "Content-Encoding",
                "Expect",
                "Transfer-Encoding",
                "Connection",
                "X-Forwarded-For",
                "Range",
                "Accept-Encoding",
            ]
        ),
        header_text,
        max_size=3,
    ),
)
def test_passthrough(
    client: Client, method: str, path: str, query: str, body: bytes, extra: dict[str, str]
) -> None:
    if extra.get("X-Test-Status", "").strip().isdigit():
        extra["X-Test-Status"] = str(min(599, max(200, int(extra["X-Test-Status"]))))
    else:
        extra.pop("X-Test-Status", None)
    if "Transfer-Encoding" in extra or "Expect" in extra:
        return  # http.client frames the body by itself; other tests cover those
    target = "/" + path.lstrip("/") + (f"?{query}" if query else "")
    if target.startswith("/admin") or target.startswith("/_test/"):
        return
    client.check(method, target, body if method not in ("GET", "HEAD") else None, extra)


def raw_request(port: int, data: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):  # a hang raises TimeoutError and fails the test
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    if not head:
        return 0, b""  # the connection was closed without an answer (a framing refusal)
    return int(head.split(b" ", 2)[1]), head + b"\r\n\r\n" + body


header_bytes = st.binary(max_size=30).map(
    lambda b: bytes(c for c in b if c not in b"\r\n\x00") or b"x"
)


@FUZZ
@given(
    target=st.sampled_from(
        [
            b"/v1/chat/completions",
            b"/v1/embeddings",
            b"/v2/models/m/infer",
            b"/echo",
            b"/admin/config",
        ]
    )
    | st.lists(
        st.sampled_from(
            [b"v1", b"..", b".", b"%2e%2E", b"x", b"chat", b"completions", b"admin", b"%2F", b""]
        ),
        max_size=6,
    ).map(lambda parts: b"/" + b"/".join(parts)),
    absolute=st.booleans(),
    headers=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    b"Authorization",
                    b"api-key",
                    b"x-api-key",
                    b"OpenAI-Organization",
                    b"OpenAI-Project",
                    b"X-Tenant",
                    b"Content-Type",
                    b"Cache-Control",
                    b"Inference-Header-Content-Length",
                    b"Accept-Encoding",
                ]
            ),
            header_bytes,
        ),
        max_size=4,
    ),
    body=openai_bodies,
)
def test_raw_targets_and_header_bytes(
    client: Client, target: bytes, absolute: bool, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """What client libraries refuse to send: undecodable header bytes (credential headers too),
    absolute-form targets, dot segments, all against every adapter's routes and the admin API."""
    if absolute:
        target = b"http://fuzz.example" + target
    head = b"POST %s HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n" % target
    head += b"".join(b"%s: %s\r\n" % (k, v.strip() or b"x") for k, v in headers)
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    client.sent += 1
    status, data = raw_request(client.port, head + body)
    if status >= 500 and b"upstream;dur" in data:
        client.upstream_500s += 1
        return
    assert status != 500 and status < 600, f"{target!r} {headers!r}: {data[:400]!r}"


def _admin_paths() -> list[str]:
    doc = yaml.safe_load(OPENAPI.read_text())
    return sorted(doc["paths"])


@FUZZ
@given(
    path=st.sampled_from(_admin_paths()) | st.text(max_size=20).map(lambda s: "/admin/" + s),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    auth=st.sampled_from([None, f"Bearer {ADMIN_TOKEN}", "Bearer", "Basic eA==", ""]) | header_text,
    body=st.binary(max_size=100),
)
def test_admin_api(client: Client, path: str, method: str, auth: str | None, body: bytes) -> None:
    path = "".join(c if 0x21 <= ord(c) <= 0x7E and c not in "#?%" else "x" for c in path)
    headers = {"Authorization": auth} if auth is not None else {}
    client.check(method, path, body or None, headers)


def test_every_documented_admin_path_exists(client: Client) -> None:
    doc = yaml.safe_load(OPENAPI.read_text())
    assert doc["openapi"].startswith("3.")
    for path, ops in doc["paths"].items():
        for method, spec in ops.items():
            status, _, _ = client.send(
                method.upper(), path, b"", {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            assert status != 404 and status != 405, f"{method.upper()} {path} → {status}"
            assert str(status) in spec["responses"], (
                f"{method.upper()} {path} → undocumented {status}"
            )
