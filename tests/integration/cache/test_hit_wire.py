"""An exact hit on the wire, from the served process: the one-block writer (gateway/hit_response.py)
must produce the same HTTP as web.Response did, keep the connection alive for the next request,
and give way to web.Response where its shortcuts would be wrong (HTTP/1.0, Connection: close).
The access log still sees the hit's status, size and X-Cache."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow
SENT: list[int] = []  # bytes of each response read, head and body (what the access log counts)
BODY = json.dumps(
    {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "wire check"}]}
).encode()


def request(version: str = "1.1", extra: str = "") -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: gw\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode() + BODY


async def response(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[str, str]], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = [(k, v) for k, _, v in (line.partition(": ") for line in lines[1:] if line)]
    lengths = [int(v) for k, v in headers if k.lower() == "content-length"]
    assert len(lengths) == 1, headers  # exactly one framing header, nothing chunked
    assert not [k for k, _ in headers if k.lower() == "transfer-encoding"]
    body = await reader.readexactly(lengths[0])
    SENT.append(len(head) + len(body))
    return lines[0].encode(), headers, body


def value(headers: list[tuple[str, str]], name: str) -> str | None:
    found = [v for k, v in headers if k.lower() == name.lower()]
    assert len(found) <= 1, (name, headers)  # no header written twice
    return found[0] if found else None


async def test_a_hit_is_well_formed_http_on_a_kept_alive_connection(
    upstream: ServerThread,
) -> None:
    cfg = cache_config(upstream.url, routes=("chat",))
    cfg["logging"] = {"access_log": "json"}
    gw = GatewayProcess(cfg).start()
    SENT.clear()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(request())
        status, miss_headers, miss_body = await response(reader)
        assert status == b"HTTP/1.1 200 OK" and value(miss_headers, "X-Cache") == "miss"
        for _ in range(3):  # hits, one after another on the same connection
            writer.write(request())
            status, headers, body = await response(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert body == miss_body
            assert value(headers, "X-Cache") == "hit"
            assert value(headers, "Content-Type") == value(miss_headers, "Content-Type")
            assert value(headers, "Age") is not None and value(headers, "Date") is not None
            assert "total;dur=" in (value(headers, "Server-Timing") or "")
            assert value(headers, "Connection") is None  # kept alive
        # the same bytes from another tenant are not its hit, on this path either
        writer.write(request(extra="Authorization: Bearer sk-other\r\n"))
        status, headers, _ = await response(reader)
        assert value(headers, "X-Cache") == "miss"
        writer.write(request(extra="Authorization: Bearer sk-other\r\n"))
        status, headers, _ = await response(reader)
        assert value(headers, "X-Cache") == "hit"
        # pipelined: two requests in one write, two answers in order
        writer.write(request() + request())
        for _ in range(2):
            status, headers, body = await response(reader)
            assert value(headers, "X-Cache") == "hit" and body == miss_body
        # Connection: close is honoured: the answer says so and the connection ends
        writer.write(request(extra="Connection: close\r\n"))
        status, headers, body = await response(reader)
        assert value(headers, "X-Cache") == "hit" and value(headers, "Connection") == "close"
        assert await reader.read() == b""
        writer.close()
        # HTTP/1.0 without keep-alive: a 1.0 answer, then the connection ends
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(request("1.0"))
        status, headers, body = await response(reader)
        assert status == b"HTTP/1.0 200 OK" and body == miss_body
        assert value(headers, "X-Cache") == "hit"
        assert await reader.read() == b""
        writer.close()
    finally:
        assert await asyncio.to_thread(gw.stop, signal.SIGTERM, 20) == 0
    logged = [
        json.loads(line.split("latentgate.access ", 1)[1].split("] ", 1)[1])
        for line in gw.log().splitlines()
        if " latentgate.access " in line and "/readyz" not in line
    ]
    hits = [x for x in logged if x.get("x_cache") == "hit"]
    assert len(hits) == 8 and all(x["status"] == 200 for x in hits)
    # what went out, as aiohttp counts it for every response (status line and headers too)
    assert [x["bytes"] for x in logged if x.get("x_cache")] == SENT[-10:]
