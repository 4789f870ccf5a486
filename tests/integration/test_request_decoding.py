"""The gateway decodes request bodies itself (gateway.codings.BodyDecoder): a coded body must end
where its coding does, whatever the coding, before any of it is forwarded as a request.

aiohttp's own decoding checked only deflate for its end, so a gzip, br or zstd body cut short was
decoded as far as it went and sent upstream as if whole: a passthrough PUT stored half a file,
and a route that parsed it answered for whatever prefix happened to parse."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import random
import zlib
from collections.abc import Callable

import aiohttp
import brotli
import pytest

from tests.conftest import base_config
from tests.integration.test_request_codings import CHAT, _send
from tests.support.servers import GatewayProcess, ServerThread


def _zstd(data: bytes) -> bytes:
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]
    out: bytes = zstd.compress(data)
    return out


PACK: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": _zstd,
}


def _cut(coding: str, plain: bytes, where: str) -> bytes:
    packed = PACK[coding](plain)
    if where == "trailer":  # gzip: all of the deflate stream, not its CRC and size
        return packed[:-8]
    return packed[: len(packed) // 2]


async def _upstream_calls(upstream: ServerThread) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return sum(int(n) for n in (await r.json())["requests"].values())


def _is_undecodable(status: int, headers: aiohttp.typedefs.LooseHeaders, body: bytes) -> bool:
    message = json.loads(body)["error"]["message"] if status == 400 else ""
    return (
        status == 400
        and str(headers["Content-Type"]).startswith("application/json")
        and "does not decode as its Content-Encoding" in message
    )


@pytest.mark.parametrize(
    ("coding", "where"),
    [
        ("gzip", "trailer"),
        ("gzip", "middle"),
        ("deflate", "middle"),
        ("br", "middle"),
        ("zstd", "middle"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/any/echo"])
async def test_a_coded_body_cut_short_is_a_json_400_and_never_forwarded(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    coding: str,
    where: str,
    path: str,
) -> None:
    gw = start_gateway(base_config(upstream.url))
    plain = json.dumps({**CHAT, "padding": "the same words again " * 40}).encode()
    before = await _upstream_calls(upstream)
    status, headers, body = await _send(
        gw.url, _cut(coding, plain, where), [("Content-Encoding", coding)], path=path
    )
    assert _is_undecodable(status, headers, body), (status, body)
    assert coding in json.loads(body)["error"]["message"]
    assert await _upstream_calls(upstream) == before  # nothing was forwarded
    # whole, the same body is answered
    status, _, body = await _send(gw.url, PACK[coding](plain), [("Content-Encoding", coding)], path)
    assert status == 200, body


async def test_the_served_process_refuses_a_gzip_body_cut_short(upstream: ServerThread) -> None:
    """`latentgate serve` (its own runner, not the tests' in-process one) decodes bodies too."""
    gw = GatewayProcess(base_config(upstream.url)).start()
    try:
        cut = _cut("gzip", json.dumps(CHAT).encode(), "trailer")
        for path in ("/v1/chat/completions", "/any/echo"):
            status, headers, body = await _send(
                gw.url, cut, [("Content-Encoding", "gzip")], path=path
            )
            assert _is_undecodable(status, headers, body), (path, status, body)
        status, _, body = await _send(
            gw.url, gzip.compress(json.dumps(CHAT).encode()), [("Content-Encoding", "gzip")]
        )
        assert status == 200, body
    finally:
        gw.stop()


async def test_a_streamed_passthrough_body_cut_short_is_not_answered_as_whole(
    gateway: ServerThread,
) -> None:
    """A passthrough body over 1 MiB is forwarded as it arrives; a coding that ends short is
    found at its end, and the upstream call fails before its body is complete: the client gets
    the 400, not the replica's answer to the half it got."""
    plain = random.Random(7).randbytes(2 << 20)  # gzip cannot shrink it: 2 MiB coded too
    packed = gzip.compress(plain, compresslevel=1)
    assert len(packed) > 1 << 20

    async def put(data: bytes) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
        h = {"Content-Encoding": "gzip", "Content-Length": str(len(data))}
        async with (
            aiohttp.ClientSession() as s,
            s.put(gateway.url + "/any/echo", data=io.BytesIO(data), headers=h) as r,
        ):
            return r.status, r.headers, await r.read()

    status, headers, body = await put(packed[: len(packed) - 4096])
    assert _is_undecodable(status, headers, body), (status, body[:200])
    status, _, body = await put(packed)
    assert status == 200 and json.loads(body)["body_len"] == len(plain)


async def test_gzip_members_one_after_another_are_one_body(gateway: ServerThread) -> None:
    """RFC 1952: a gzip file is a series of members; `cat a.gz b.gz` decodes to a + b."""
    plain = json.dumps({"hello": "world" * 50}).encode()
    half = len(plain) // 2
    two = gzip.compress(plain[:half]) + gzip.compress(plain[half:])
    status, _, body = await _send(gateway.url, two, [("Content-Encoding", "gzip")], "/any/echo")
    assert status == 200, body
    assert json.loads(body)["body_len"] == len(plain)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_bytes_after_the_coded_stream_are_a_json_400(
    gateway: ServerThread, coding: str
) -> None:
    """Whatever follows the end of the stream is not part of the body the coding describes:
    refused, not dropped or forwarded."""
    packed = PACK[coding](json.dumps(CHAT).encode()) + b"tail"
    status, headers, body = await _send(gateway.url, packed, [("Content-Encoding", coding)])
    assert _is_undecodable(status, headers, body), (status, body)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
async def test_a_body_that_decodes_past_the_limit_is_the_json_413(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], coding: str
) -> None:
    """The decoded size is bounded as it grows: a small body that inflates past
    limits.max_body_bytes is refused whole, on every coding and on a streamed passthrough."""
    limit = 64 << 10
    gw = start_gateway(base_config(upstream.url, limits={"max_body_bytes": limit}))
    bomb = PACK[coding](b"{" + b" " * (64 * limit) + b"}")
    assert len(bomb) < limit
    for path in ("/v1/chat/completions", "/any/echo"):
        status, headers, body = await _send(gw.url, bomb, [("Content-Encoding", coding)], path)
        assert status == 413, (path, body[:200])
        assert str(headers["Content-Type"]).startswith("application/json")
        assert str(limit) in json.loads(body)["error"]["message"]


async def test_a_coding_label_on_a_request_without_a_body_is_ignored(
    gateway: ServerThread,
) -> None:
    """A GET that says Content-Encoding but sends no body has nothing to decode (found by the
    fuzzer: a 500 while the decoder looked at the empty body's reader)."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(gateway.url + "/any/echo", headers={"Content-Encoding": "gzip"}) as r,
    ):
        assert r.status == 200, await r.text()
        assert (await r.json())["body_len"] == 0


async def test_a_cut_body_sent_after_its_headers_is_refused_when_it_ends(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """A coded body that arrives after the headers, cut short: refused once its last byte is
    in, as a 400 (before, a deflate one waited out body_read_timeout_s: a 408)."""
    cfg = base_config(upstream.url, limits={"body_read_timeout_s": 60})
    gw = start_gateway(cfg)
    cut = zlib.compress(json.dumps(CHAT).encode())[:-4]
    r, w = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        w.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
            b"\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n" % len(cut)
        )
        await w.drain()
        await asyncio.sleep(0.2)  # the handler is waiting for the body by now
        w.write(cut)
        await w.drain()
        status = await asyncio.wait_for(r.readline(), 30)
    finally:
        w.close()
    assert status.startswith(b"HTTP/1.1 400 "), status


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_a_body_of_many_tiny_members_is_refused_without_holding_the_loop(
    gateway: ServerThread, coding: str
) -> None:
    """A member is a decompressor each, and what follows one came back as a copy of the rest of
    the body: 1 MiB of empty members (20 bytes of gzip, 9 of zstd) was 52,000 or 116,000 of
    them, decoded on the event loop (14 s for zstd, every other client waiting; 2 MiB, 30 s).
    Now at most one member per 4 KiB of max_body_bytes: a JSON 413 at once; a body of fewer
    members, whatever their size, is one body as before."""
    empty = PACK[coding](b"")
    many = empty * ((1 << 20) // len(empty))
    # (the refusal is the member cap's 413; no timing is asserted)
    status, headers, body = await _send(
        gateway.url, many, [("Content-Encoding", coding)], "/any/echo"
    )
    assert status == 413, body[:200]
    assert str(headers["Content-Type"]).startswith("application/json")
    assert f"more than 4096 {coding} members" in json.loads(body)["error"]["message"]
    # 2000 members of 4 KiB each (bgzip's blocks are 64 KiB): decoded whole, in order
    rng = random.Random(11)
    plain = [rng.randbytes(2048).hex().encode() for _ in range(2000)]
    packed = b"".join(PACK[coding](p) for p in plain)
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gateway.url + "/any/echo",
            data=io.BytesIO(packed),
            headers={"Content-Encoding": coding, "Content-Length": str(len(packed))},
        ) as r,
    ):
        assert r.status == 200, await r.text()
        assert (await r.json())["body_len"] == sum(map(len, plain))
