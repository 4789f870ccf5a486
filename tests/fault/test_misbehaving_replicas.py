"""Replicas that break HTTP in ways a framework would not let them (raw socket servers write
every byte), through a real gateway to a real client: the client gets a clear JSON error or a
whole answer, never a hang, and nothing broken is cached."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.fault.conftest import pool_config
from tests.support.raw_replica import RawReplica, json_answer, read_request
from tests.support.raw_upload import chunked_upload
from tests.support.servers import ServerThread

StartGateway = Callable[..., ServerThread]
CLIENTS = ["lean", "aiohttp"]
# "does not hang": far above any timeout these gateways are given, far below pytest's
_BOUND_S = 60


@pytest.fixture(params=CLIENTS)
def http_client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _passthrough(total: float) -> list[dict[str, Any]]:
    return [
        {
            "name": "files",
            "match": {"prefix": "/"},
            "backend": "pool",
            "upstream": {"timeouts": {"total": total}, "retries": {"max": 0}},
        }
    ]


async def test_an_upload_to_a_replica_that_never_reads_is_a_504_within_the_total(
    start_gateway: StartGateway, http_client: str
) -> None:
    """A replica that accepts the connection and never reads: a streamed upload (chunked, so
    passed through as it comes) fills the socket buffers and the gateway's writes stall. The
    route's total bounds the exchange there too; before, the lean transport waited for the
    replica to drain for ever and the client hung."""

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    replica = RawReplica(never_reads)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _passthrough(1), pool={"http_client": http_client}))
        # 12.5 MiB: more than loopback's socket buffers hold
        head, body = await chunked_upload(gw.url, 200, _BOUND_S)
        assert head.startswith(b"HTTP/1.1 504 ")
        assert "timed out" in body["error"]["message"]
    finally:
        await replica.stop()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
ANSWER = (
    b'{"id":"c","object":"chat.completion","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
)


def _cached_chat() -> list[dict[str, Any]]:
    return [
        {
            "name": "chat",
            "match": {"path": "/v1/chat/completions", "methods": ["POST"]},
            "protocol": "openai",
            "backend": "pool",
            "cache": {"exact": {"enabled": True, "tiers": ["memory"]}},
        }
    ]


async def _chat(url: str) -> tuple[int, str | None, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/chat/completions",
            json=CHAT,
            timeout=aiohttp.ClientTimeout(total=_BOUND_S),
        ) as r,
    ):
        return r.status, r.headers.get("X-Cache"), await r.read()


_ENDLESS = b"endless"
OVERSIZE_HEADS = {
    "one 200 KB field": json_answer(ANSWER, b"X-Big: " + b"a" * 200_000 + b"\r\n"),
    "129 fields": json_answer(ANSWER, b"".join(b"X-F%d: v\r\n" % i for i in range(129))),
    "a status line past 8190 bytes": b"HTTP/1.1 200 " + b"O" * 9000 + b"\r\n\r\n",
    "a field that never ends": _ENDLESS,
}


@pytest.mark.parametrize("head", list(OVERSIZE_HEADS))
async def test_a_response_head_past_the_clients_limits_is_a_502_and_not_cached(
    start_gateway: StartGateway, http_client: str, head: str
) -> None:
    """aiohttp's client refuses a field over 8190 bytes or more than 128 fields; the lean
    transport took any head. A 200 KB header went to the client (whose own parser refused it)
    and into the cache, so every hit failed too; a field that never ends grew in memory until
    the route's total. Now both transports answer 502 and keep nothing."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            got, _ = await read_request(reader)
            replica.seen(got)
            if OVERSIZE_HEADS[head] is _ENDLESS:
                writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
                while True:  # until the gateway hangs up
                    writer.write(b"a" * 65536)
                    await writer.drain()
            writer.write(OVERSIZE_HEADS[head])
            await writer.drain()

    replica = RawReplica(script)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _cached_chat(), pool={"http_client": http_client}))
        for _ in range(2):
            before = len(replica.requests)
            status, x_cache, body = await _chat(gw.url)
            assert status == 502, body[:200]
            assert x_cache is None
            assert b"upstream pool failed" in body
            assert len(replica.requests) > before  # nothing was stored: it asks again
    finally:
        await replica.stop()


async def test_a_200_whose_json_does_not_parse_is_passed_on_but_never_cached(
    start_gateway: StartGateway,
) -> None:
    """A replica that frames a broken JSON answer correctly (its Content-Length matches): the
    client gets what it sent, but the cache keeps it no more than it keeps such a body read to
    the connection's close. Before, every later client was served the broken body as a hit
    until the TTL, and its SDK failed on it."""
    broken = ANSWER[:40]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            got, _ = await read_request(reader)
            replica.seen(got)
            writer.write(json_answer(broken if len(replica.requests) == 1 else ANSWER))
            await writer.drain()

    replica = RawReplica(script)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _cached_chat()))
        assert await _chat(gw.url) == (200, "miss", broken)
        assert await _chat(gw.url) == (200, "miss", ANSWER)  # asked again, not replayed
        assert await _chat(gw.url) == (200, "hit", ANSWER)  # a whole answer is kept
        assert len(replica.requests) == 2
    finally:
        await replica.stop()


async def test_a_replica_that_hangs_up_after_each_answer_fails_no_unretried_request(
    start_gateway: StartGateway, http_client: str
) -> None:
    """A replica that closes every connection right after its answer, without saying
    `Connection: close`. A POST on a passthrough route is not idempotent, so it is never
    retried: it must not be written to a connection the replica has already hung up. Before,
    the lean transport handed such a connection out in the moment between the replica's FIN
    and the connection's end: about one request in eight was dropped unsent and answered
    502 (the replica saw fewer requests than the client sent)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got, _ = await read_request(reader)
        replica.seen(got)
        # held back until the close, so the answer and the FIN arrive together: the gateway
        # cannot read the one without the other being there (no race in this test)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        writer.write(json_answer(b'{"ok":true}'))  # then the handler returns, closing it

    replica = RawReplica(script)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _passthrough(10), pool={"http_client": http_client}))
        statuses: list[int] = []
        async with aiohttp.ClientSession() as s:

            async def one() -> None:
                async with s.post(gw.url + "/jobs", data=b"x") as r:
                    await r.read()
                    statuses.append(r.status)

            for _ in range(50):
                await asyncio.gather(*(one() for _ in range(4)))
        assert statuses == [200] * 200
        assert len(replica.requests) == 200  # each sent once: none lost, none repeated
    finally:
        await replica.stop()
