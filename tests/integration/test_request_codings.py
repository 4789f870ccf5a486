"""Request bodies sent with a Content-Encoding, and directives split over repeated header lines.

The gateway decodes gzip/deflate/br/zstd request bodies before it reads them: the upstream must
get the decoded body without the coding's label, and a body that does not decode is the client's
error (a JSON 4xx), not a 500 with the connection closed. Bodies cut short, several members and
bounds while decoding: test_request_decoding.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Callable

import aiohttp
import pytest

from tests.conftest import base_config
from tests.integration.cache.conftest import ADMIN_TOKEN, anthropic_route, cache_config
from tests.support.servers import GatewayProcess, ServerThread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "two plus two"}], "temperature": 0}


async def _send(
    url: str, data: bytes, headers: list[tuple[str, str]], path: str = "/v1/chat/completions"
) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
    h = [("Authorization", "Bearer sk-alice"), ("Content-Type", "application/json"), *headers]
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(url + path, data=data, headers=h, skip_auto_headers=["Accept-Encoding"]) as r,
    ):
        return r.status, r.headers, await r.read()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_compressed_body_reaches_the_upstream_decoded_and_unlabelled(
    gateway: ServerThread, coding: str
) -> None:
    plain = json.dumps({"hello": "world" * 50}).encode()
    packed = gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
    status, _, body = await _send(
        gateway.url, packed, [("Content-Encoding", coding)], path="/any/echo"
    )
    assert status == 200
    echo = json.loads(body)
    got = {k.lower(): v for k, v in echo["headers"]}
    assert "content-encoding" not in got
    assert echo["body_len"] == len(plain) and int(got["content-length"]) == len(plain)


async def test_a_compressed_chat_request_is_answered_and_cached(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    packed = gzip.compress(json.dumps(CHAT).encode())
    first = await _send(gw.url, packed, [("Content-Encoding", "gzip")])
    again = await _send(gw.url, json.dumps(CHAT).encode(), [])
    assert first[0] == 200 and again[0] == 200
    assert first[1]["X-Cache"] == "miss" and again[1]["X-Cache"] == "hit"
    assert again[2] == first[2]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decode_is_a_json_400(
    gateway: ServerThread, coding: str
) -> None:
    for path in ("/v1/chat/completions", "/any/echo"):
        status, headers, body = await _send(
            gateway.url, b'{"model": "m"}', [("Content-Encoding", coding)], path=path
        )
        assert status == 400, body
        assert headers["Content-Type"].startswith("application/json")
        assert "content-encoding" in json.loads(body)["error"]["message"].lower()
    # the gateway is still there for the next request
    status, _, _ = await _send(gateway.url, json.dumps(CHAT).encode(), [])
    assert status == 200


async def test_no_store_on_a_second_cache_control_line_is_honoured(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = json.dumps(CHAT).encode()
    split = [("Cache-Control", "max-age=600"), ("Cache-Control", "no-store")]
    status, headers, _ = await _send(gw.url, body, split)
    assert status == 200 and headers["X-Cache"] != "hit"
    status, headers, _ = await _send(gw.url, body, [])
    assert headers["X-Cache"] == "miss"  # nothing was stored by the no-store request
    # and no-cache on a second line still revalidates a stored entry
    status, headers, _ = await _send(
        gw.url, body, [("Cache-Control", "max-stale"), ("Cache-Control", "no-cache")]
    )
    assert headers["X-Cache"] != "hit"


async def test_a_second_anthropic_beta_line_is_another_request(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    body = json.dumps(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "p"}]}
    ).encode()
    ant = [("x-api-key", "sk-ant-alice"), ("anthropic-version", "2023-06-01")]

    async def send(*beta: str) -> str:
        _, headers, _ = await _send(
            gw.url, body, ant + [("anthropic-beta", b) for b in beta], path="/v1/messages"
        )
        return str(headers["X-Cache"])

    assert await send("a") == "miss"
    assert await send("a") == "hit"
    assert await send("a", "b") == "miss"  # the upstream saw beta a and b: not a's answer
    assert await send("a, b") == "hit"  # the same set on one line
    assert await send("b", "a") == "hit"


@pytest.mark.parametrize("label", ["GZIP", "Gzip"])
async def test_a_gzip_label_in_any_case_is_decoded(gateway: ServerThread, label: str) -> None:
    plain = json.dumps({"hello": "world" * 50}).encode()
    status, _, body = await _send(
        gateway.url, gzip.compress(plain), [("Content-Encoding", label)], path="/any/echo"
    )
    assert status == 200 and json.loads(body)["body_len"] == len(plain)


async def test_a_zstd_body_is_decoded_like_gzip(gateway: ServerThread) -> None:
    from backports import zstd  # a dependency below Python 3.14 (compression.zstd from 3.14)

    plain = json.dumps({"hello": "world" * 50}).encode()
    status, _, body = await _send(
        gateway.url, zstd.compress(plain), [("Content-Encoding", "zstd")], path="/any/echo"
    )
    assert status == 200, body
    echo = json.loads(body)
    got = {k.lower(): v for k, v in echo["headers"]}
    assert "content-encoding" not in got and echo["body_len"] == len(plain)
    status, _, body = await _send(
        gateway.url, zstd.compress(json.dumps(CHAT).encode()), [("Content-Encoding", "zstd")]
    )
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"], body


@pytest.mark.parametrize(
    "coding",
    [
        ["compress"],
        ["x-custom"],
        ["gzip, br"],
        ["gzip", "gzip"],
        # aiohttp decodes none of these: they would reach the upstream still gzip, unlabelled
        ["identity, gzip"],
        ["gzip,"],
        ["gzip", "identity"],
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/any/echo"])
async def test_a_body_in_a_coding_the_gateway_does_not_decode_is_a_415(
    gateway: ServerThread, coding: list[str], path: str
) -> None:
    """Not forwarded still encoded under a plain label: a JSON 415 naming what is accepted."""
    plain = json.dumps(CHAT).encode()  # valid JSON even: the label alone decides
    status, headers, body = await _send(
        gateway.url, plain, [("Content-Encoding", c) for c in coding], path=path
    )
    assert status == 415, body
    assert headers["Content-Type"].startswith("application/json")
    assert "content-encoding" in json.loads(body)["error"]["message"].lower()
    assert set(headers["Accept-Encoding"].split(", ")) >= {"gzip", "deflate", "br", "zstd"}
    # identity is no coding at all
    status, _, _ = await _send(gateway.url, plain, [("Content-Encoding", "identity")], path=path)
    assert status == 200


async def test_an_admin_body_in_a_coding_the_gateway_does_not_decode_is_a_415(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The gateway reads admin bodies itself: a coding aiohttp left encoded is refused there
    too (it used to be parsed as if plain: a 400 that blamed the JSON), and a gzip one works."""
    gw = start_gateway(cache_config(upstream.url))
    await _send(gw.url, json.dumps(CHAT).encode(), [])  # one entry to purge
    purge = json.dumps({"all": True}).encode()

    async def admin(path: str, data: bytes, coding: str) -> tuple[int, str, bytes]:
        h = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Encoding": coding}
        async with aiohttp.ClientSession() as s, s.post(gw.url + path, data=data, headers=h) as r:
            return r.status, r.headers["Content-Type"], await r.read()

    status, ctype, body = await admin("/admin/cache/purge", purge, "x-custom")
    assert status == 415, body  # (the semantic wrong-hit report: tests/semantic/test_gateway.py)
    assert ctype.startswith("application/json")
    assert "x-custom" in json.loads(body)["error"]["message"]
    status, _, body = await admin("/admin/cache/purge", gzip.compress(purge), "gzip")
    assert status == 200, body
    assert json.loads(body)["purged"] == {"memory": 1}


async def test_an_admin_body_over_the_limit_is_the_json_413(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Sent over limits.max_body_bytes, or a small gzip body that decodes past it: the JSON
    error envelope every other admin error uses, not aiohttp's text/plain 413."""
    cfg = cache_config(upstream.url)
    cfg["limits"] = {"max_body_bytes": 4096}
    gw = start_gateway(cfg)
    big = json.dumps({"route": "x" * 8192}).encode()
    bomb = gzip.compress(json.dumps({"route": " " * 65536}).encode())
    assert len(bomb) < 4096
    for data, coding in ((big, "identity"), (bomb, "gzip")):
        h = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Encoding": coding}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/admin/cache/purge", data=data, headers=h) as r,
        ):
            body = await r.read()
            assert r.status == 413, body
            assert r.headers["Content-Type"].startswith("application/json"), body
            assert "4096" in json.loads(body)["error"]["message"]


async def _refused_then_again(port: int, body: bytes, coding: str | None) -> bytes:
    """Half of an oversized body, its 413, then the other half and a second request on the
    same connection: that request's status line, or b"" when the gateway closed it."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            + (f"Content-Encoding: {coding}\r\n" if coding else "")
            + "\r\n"
        )
        half = len(body) // 2
        w.write(head.encode() + body[:half])
        await w.drain()
        assert b" 413 " in await r.readline()
        length = 0
        while (line := await r.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await r.readexactly(length)
        try:
            w.write(body[half:] + b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            await w.drain()
            return await r.readline()
        except ConnectionError:
            return b""
    finally:
        w.close()


async def test_a_refused_compressed_body_closes_the_connection_instead_of_being_inflated(
    upstream: ServerThread,
) -> None:
    """A small gzip body that inflates past max_body_bytes gets its 413, and the connection is
    closed: aiohttp's lingering read would otherwise inflate the rest of it (gigabytes, for a
    bomb) on the event loop for up to 10 s. A plain oversized body is still read to its end,
    and its connection serves the next request."""
    limit = 1 << 20
    gw = GatewayProcess(base_config(upstream.url, limits={"max_body_bytes": limit})).start()
    try:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
        bomb = packer.compress(b"\0" * (64 * limit)) + packer.flush()
        assert len(bomb) < limit // 8
        assert await _refused_then_again(gw.port, bomb, "gzip") == b""
        plain = b" " * (2 * limit)
        assert await _refused_then_again(gw.port, plain, None) == b"HTTP/1.1 200 OK\r\n"
    finally:
        gw.stop()
