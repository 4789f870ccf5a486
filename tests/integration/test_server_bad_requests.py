"""The served gateway process answers what its HTTP parser refuses, and bodies that do not
decode, like every other bad input: a 400 with a JSON error body (aiohttp's own answer is
text/plain with the offending bytes echoed back)."""

from __future__ import annotations

import asyncio
import json
import socket
import zlib

import aiohttp
import pytest

from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow
CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two three four five"}]}


def _raw(port: int, request: bytes) -> tuple[int, str, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    ctype = next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("content-type:")),
        "",
    )
    return int(lines[0].split()[1]), ctype, body


async def test_a_truncated_deflate_body_is_a_json_400_that_says_so(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    """A deflate body whose compressed stream stops short: the parser's own word for it was
    the whole message ("deflate"); the client is told its body does not decode. (The body was
    read to its Content-Length, so the connection could serve another request: closed here by
    the request itself, for `_raw`.)"""
    gw = GatewayProcess(base_config(upstream.url)).start(semantic_ready=False)
    procs.append(gw)
    cut = zlib.compress(json.dumps(CHAT).encode())[:-4]
    for path in (b"/v1/chat/completions", b"/echo"):
        request = (
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: deflate\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(cut) + cut
        )
        status, ctype, body = await asyncio.to_thread(_raw, gw.port, request)
        assert status == 400, body
        assert ctype.startswith("application/json"), (ctype, body)
        error = json.loads(body)["error"]
        assert error["code"] == 400
        assert "does not decode as its Content-Encoding (deflate)" in error["message"], error


async def test_requests_the_http_parser_refuses_get_a_json_400(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    """aiohttp answers what its parser refuses in text/plain (with the offending bytes echoed
    back); the served gateway answers it like every other bad input: a 400 with a JSON error."""
    gw = GatewayProcess(base_config(upstream.url)).start(semantic_ready=False)
    procs.append(gw)
    cases = {
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n": "Content-Length",
        b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n": "method",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n": "header",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n": "chunk",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n": "too long",
    }
    for request, said in cases.items():
        status, ctype, body = await asyncio.to_thread(_raw, gw.port, request)
        assert status == 400, body
        assert ctype.startswith("application/json"), (ctype, body)
        error = json.loads(body)["error"]
        assert said in error["message"] and error["code"] == 400, error
        assert b"aaaa" not in body  # the line is not echoed back
    # and the gateway still serves
    chat = gw.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(chat, json=CHAT) as r:
        assert r.status == 200
