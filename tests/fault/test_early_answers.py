"""A replica that answers before it has read the request's body (RFC 9112 9.5: a server may
refuse an upload it will not take, e.g. 413, and stop reading): the gateway stops sending,
passes the replica's answer on and never reuses the connection, whose request was cut short."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from tests.fault.conftest import pool_config
from tests.support.raw_replica import RawReplica
from tests.support.raw_upload import chunked_upload
from tests.support.servers import ServerThread

StartGateway = Callable[..., ServerThread]
# "does not hang": far above what relaying an answer takes, far below pytest's timeout
_BOUND_S = 60
REFUSAL = b'{"error":{"message":"upload too large for this replica","type":"too_large"}}'


def _passthrough(total: float) -> list[dict[str, object]]:
    return [
        {
            "name": "files",
            "match": {"prefix": "/"},
            "backend": "pool",
            "upstream": {"timeouts": {"total": total}, "retries": {"max": 0}},
        }
    ]


@pytest.mark.parametrize("http_client", ["lean", "aiohttp"])
async def test_a_replica_that_refuses_an_upload_before_reading_it_is_relayed(
    start_gateway: StartGateway, http_client: str
) -> None:
    """The replica answers 413 as soon as it has the head, then reads nothing more. Before, the
    lean transport went on writing the body into full socket buffers until the route's total
    and answered 504 "timed out", hiding the replica's answer (aiohttp's client relayed it)."""

    async def refuse_early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        replica.seen(head)
        writer.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(REFUSAL), REFUSAL)
        )
        await writer.drain()
        await asyncio.sleep(3600)  # reads nothing more; the gateway hangs up

    replica = RawReplica(refuse_early)
    url = await replica.start()
    try:
        # a total far beyond relaying the answer: before, the exchange ended only there
        gw = start_gateway(pool_config([url], _passthrough(20), pool={"http_client": http_client}))
        # 12.5 MiB: more than loopback's buffers hold
        head, body = await chunked_upload(gw.url, 200, _BOUND_S)
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert body["error"]["type"] == "too_large"
        assert len(replica.requests) == 1
    finally:
        await replica.stop()


async def test_after_an_early_answer_the_next_request_gets_a_fresh_connection(
    start_gateway: StartGateway,
) -> None:
    """An answer that came before the whole body was sent leaves the connection mid-request
    (the replica would read the rest of the body as the next request's head), even when the
    replica said nothing of closing it: the next request opens a new one."""

    async def refuse_then_serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        replica.seen(head)
        writer.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(REFUSAL), REFUSAL)
        )
        await writer.drain()
        await asyncio.sleep(3600)

    replica = RawReplica(refuse_then_serve)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _passthrough(20)))
        for _ in range(2):
            head, _body = await chunked_upload(gw.url, 200, _BOUND_S)
            assert head.startswith(b"HTTP/1.1 413 "), head
        assert replica.connections == 2
        assert len(replica.requests) == 2
    finally:
        await replica.stop()


@pytest.mark.parametrize("http_client", ["lean", "aiohttp"])
async def test_an_early_2xx_from_a_replica_that_reads_on_gets_the_whole_upload(
    start_gateway: StartGateway, http_client: str
) -> None:
    """A replica that starts its 200 (with Connection: close) as soon as it has the head, then
    reads the whole body and answers with what it read: an early success is no refusal, so the
    upload goes on to its end (RFC 9112 9.5 stops an upload for an error only)."""

    async def answer_as_it_reads(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        replica.seen(head)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        total = 0
        while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) > 0:
            total += len(await reader.readexactly(size + 2)) - 2
        await reader.readexactly(2)
        writer.write(json.dumps({"error": {"type": "none"}, "read": total}).encode())
        await writer.drain()

    replica = RawReplica(answer_as_it_reads)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _passthrough(20), pool={"http_client": http_client}))
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(200):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _BOUND_S)
        assert head.startswith(b"HTTP/1.1 200 "), head
        # the replica's body ends with its connection: the gateway passes it on chunked
        assert b"transfer-encoding: chunked" in head.lower(), head
        framed = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), _BOUND_S)
        body, rest = b"", framed
        while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
            rest = rest.split(b"\r\n", 1)[1]
            body, rest = body + rest[:size], rest[size + 2 :]
        assert json.loads(body)["read"] == 200 * 65536
        writer.close()
    finally:
        await replica.stop()
