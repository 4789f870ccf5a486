"""Transparent proxying: headers, methods, bodies, limits, errors, health and metrics."""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import msgpack
import pytest

from tests.conftest import base_config
from tests.support.servers import ServerThread, free_port


async def test_headers_hop_by_hop_and_forwarded(gateway: ServerThread) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.put(
            gateway.url + "/any/path?x=1&y=2",
            data=b"payload",
            headers={
                "Connection": "keep-alive, X-Drop-Me",
                "X-Drop-Me": "1",
                "X-Keep": "yes",
                "Authorization": "Bearer abc",
                "X-Forwarded-For": "10.0.0.9",
            },
        ) as r,
    ):
        assert r.status == 200
        assert r.headers["X-Upstream-Custom"] == "kept"
        echo = await r.json()
    got = {k.lower(): v for k, v in echo["headers"]}
    assert echo["method"] == "PUT" and echo["path"] == "/any/path" and echo["query"] == "x=1&y=2"
    assert echo["body_len"] == 7
    assert "x-drop-me" not in got
    assert got["x-keep"] == "yes" and got["authorization"] == "Bearer abc"
    assert got["x-forwarded-for"] == "10.0.0.9, 127.0.0.1"
    assert got["x-forwarded-proto"] == "http"
    assert got["x-forwarded-host"].startswith("127.0.0.1:")


async def test_methods_and_large_streamed_body(gateway: ServerThread) -> None:
    big = os.urandom(3 << 20)
    async with aiohttp.ClientSession() as s:
        for method in ("GET", "DELETE", "PATCH", "OPTIONS"):
            async with s.request(method, gateway.url + "/m") as r:
                assert r.status == 200
                assert (await r.json())["method"] == method

        async def gen():  # chunked upload of unknown length streams through
            for i in range(0, len(big), 65536):
                yield big[i : i + 65536]

        async with s.post(gateway.url + "/upload", data=gen()) as r:
            echo = await r.json()
        import hashlib

        assert echo["body_len"] == len(big)
        assert echo["body_sha1"] == hashlib.sha1(big).hexdigest()


async def test_malformed_bodies_are_400_json(gateway: ServerThread) -> None:
    async with aiohttp.ClientSession() as s:
        cases = [
            (b"{not json", "application/json", "not valid JSON"),
            (b"[1,2]", "application/json", "JSON object"),
            (b"\xc1\xff\x00", "application/msgpack", "msgpack"),
            (json.dumps({"messages": []}).encode(), "application/json", "'model'"),
            (
                json.dumps({"model": "m", "messages": "hi"}).encode(),
                "application/json",
                "'messages'",
            ),
            (
                json.dumps({"model": "m", "messages": [], "stream": "yes"}).encode(),
                "application/json",
                "'stream'",
            ),
            (b"", "application/json", "empty"),
        ]
        for body, ctype, needle in cases:
            async with s.post(
                gateway.url + "/v1/chat/completions", data=body, headers={"Content-Type": ctype}
            ) as r:
                assert r.status == 400, body
                err = await r.json()
                assert needle in err["error"]["message"], (needle, err)
                assert err["error"]["type"] == "invalid_request_error"
        async with s.post(
            gateway.url + "/v2/models/add/infer", data=b'{"inputs": [{"name": "x"}]}'
        ) as r:
            assert r.status == 400
            assert "datatype" in (await r.json())["error"]


async def test_msgpack_body_forwarded(gateway: ServerThread, upstream: ServerThread) -> None:
    body = msgpack.packb({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as s:
        async with s.post(
            gateway.url + "/v1/embeddings",
            data=msgpack.packb({"model": "m"}),
            headers={"Content-Type": "application/msgpack"},
        ) as r:
            assert r.status == 400
            assert "'input'" in (await r.json())["error"]["message"]
        async with s.post(
            gateway.url + "/other", data=body, headers={"Content-Type": "application/msgpack"}
        ) as r:
            assert (await r.json())["body_len"] == len(body)


async def test_oversize_is_413(upstream: ServerThread, start_gateway) -> None:
    gw = start_gateway(base_config(upstream.url, limits={"max_body_bytes": 1000}))
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gw.url + "/v1/chat/completions",
            data=b"x" * 5000,
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        assert r.status == 413
        assert "exceeds" in (await r.json())["error"]["message"]


async def test_oversize_chunked_body_is_413(upstream: ServerThread, start_gateway) -> None:
    """No Content-Length to refuse early: the size is checked on the body as it arrived."""
    gw = start_gateway(base_config(upstream.url, limits={"max_body_bytes": 1000}))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    chunk = b"x" * 1500
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk)
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")


async def test_slow_upstream_504_unreachable_502(upstream: ServerThread, start_gateway) -> None:
    cfg = base_config(upstream.url)
    cfg["backends"]["upstream"]["timeouts"] = {"connect": 1, "read": 0.3, "total": 0.5}
    cfg["backends"]["dead"] = {"kind": "remote", "replicas": [f"http://127.0.0.1:{free_port()}"]}
    cfg["routes"].insert(0, {"name": "dead", "match": {"prefix": "/dead"}, "backend": "dead"})
    gw = start_gateway(cfg)
    import time

    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(
            gw.url + "/v1/chat/completions",
            headers={"X-Test-Delay": "3"},
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        ) as r:
            assert r.status == 504
            assert (await r.json())["error"]["type"] == "upstream_timeout"
        assert time.monotonic() - t0 < 2.0
        async with s.get(gw.url + "/dead/x") as r:
            assert r.status == 502
            assert "cannot connect" in (await r.json())["error"]["message"]


async def test_method_not_allowed_and_not_found(upstream: ServerThread, start_gateway) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"] = [r for r in cfg["routes"] if r["name"] != "default"]
    gw = start_gateway(cfg)
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/v1/chat/completions") as r:
            assert r.status == 405
        async with s.get(gw.url + "/nothing") as r:
            assert r.status == 404
            assert (await r.json())["error"]["type"] == "not_found"


async def test_health_ready_metrics_and_server_timing(gateway: ServerThread) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/healthz") as r:
            assert r.status == 200
        async with s.get(gateway.url + "/readyz") as r:
            ready = await r.json()
            assert r.status == 200 and ready["ready"] is True
            assert "upstream" in ready["backends"]
        async with s.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        ) as r:
            timing = r.headers["Server-Timing"]
            assert "parse;dur=" in timing and "upstream;dur=" in timing and "total;dur=" in timing
        async with s.get(gateway.url + "/metrics") as r:
            text = await r.text()
    assert 'latentgate_requests_total{backend="upstream",route="chat",status="200"} 1.0' in text
    assert "latentgate_request_duration_seconds_bucket" in text
    assert "latentgate_in_flight_requests" in text
    assert 'latentgate_upstream_connections{backend="upstream"' in text


async def test_unix_socket_listener_and_upstream(start_gateway, tmp_sock_dir: str) -> None:
    up_sock = os.path.join(tmp_sock_dir, "up.sock")
    gw_sock = os.path.join(tmp_sock_dir, "gw.sock")
    from tests.support.upstream import build_upstream

    up = ServerThread(build_upstream, uds=up_sock, tcp=False).start()
    try:
        gw = start_gateway(base_config(f"unix:{up_sock}"), uds=gw_sock)
        conn = aiohttp.UnixConnector(path=gw_sock)
        async with (
            aiohttp.ClientSession(connector=conn) as s,
            s.post(
                "http://gw/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "via uds"}]},
            ) as r,
        ):
            assert r.status == 200
            assert (await r.json())["choices"][0]["message"]["content"] == "echo(up): via uds"
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/x") as r:  # TCP at the same time
            assert r.status == 200
    finally:
        up.stop()


async def test_head_keeps_the_upstreams_content_length(
    upstream: ServerThread, gateway: ServerThread
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.head(upstream.url + "/v1/models") as r:
            size = r.headers["Content-Length"]  # what the upstream's GET would send
        async with s.head(gateway.url + "/v1/models") as r:
            assert r.status == 200
            assert r.headers.get("Content-Length") == size and int(size) > 0
            assert await r.read() == b""
        # and the connection is still good for the next request
        async with s.get(gateway.url + "/v1/models") as r:
            assert r.status == 200


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_an_oversize_streamed_upload_is_413_and_no_mark_on_the_replica(
    upstream: ServerThread, start_gateway, client: str
) -> None:
    """A passthrough body is streamed upstream as it arrives; one that outgrows the limit is
    the client's error (413), not the replica's: a client must not get healthy replicas
    ejected by sending too much."""
    cfg = base_config(upstream.url, limits={"max_body_bytes": 1000})
    cfg["backends"]["upstream"]["outlier"] = {"consecutive_errors": 3, "base_ejection_s": 30}
    cfg["backends"]["upstream"]["pool"] = {"http_client": client}
    gw = start_gateway(cfg)
    chunk = b"x" * 700
    for _ in range(6):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /any/upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 3
            + b"0\r\n\r\n"
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 413"), head[:80]
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
        assert "latentgate_upstream_ejections_total{" not in text
        assert not [
            line
            for line in text.splitlines()
            if line.startswith("latentgate_upstream_errors_total{") and not line.endswith(" 0.0")
        ]
        async with s.get(gw.url + "/any/after") as r:
            assert r.status == 200
