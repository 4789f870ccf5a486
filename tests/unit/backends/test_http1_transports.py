"""Both HTTP/1.1 transports (the lean one, the default for http:// and unix: replicas, and
aiohttp's) against real loopback servers that answer as real and broken replicas do: each case
runs on both and must come out the same, so switching `pool.http_client` changes nothing but CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout
from backends.remote.transports.base import Transport
from backends.remote.transports.http1 import Http1Transport
from backends.remote.transports.lean_http1 import LeanHttp1Transport
from backends.settings import PoolLimits, Timeouts
from tests.support.raw_replica import Script, read_request

KINDS = ["lean", "aiohttp"]


class Replica:
    """A TCP server on 127.0.0.1 (or a unix socket) running `script` per connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def _on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.script(reader, writer)
        writer.close()

    async def start(self, unix: Path | None = None) -> str:
        if unix is not None:
            self.server = await asyncio.start_unix_server(self._on, str(unix))
            return f"unix:{unix}"
        self.server = await asyncio.start_server(self._on, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:  # handlers still reading (keep-alive) or sleeping
            w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.wait_closed(), 1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1)


def ok_json(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def make(kind: str, url: str, **timeouts: float) -> Transport:
    limits = PoolLimits(max_connections=4, keepalive_s=30)
    t = Timeouts(**{"connect": 1.0, "read": 2.0, "total": 5.0, **timeouts})
    return LeanHttp1Transport(url, limits, t) if kind == "lean" else Http1Transport(url, limits, t)


def post(body: bytes | AsyncIterator[bytes] | None = b'{"q":1}', **kw: object) -> UpstreamRequest:
    headers = kw.pop("headers", [("Content-Type", "application/json")])
    return UpstreamRequest(
        method=str(kw.pop("method", "POST")),
        path_qs=str(kw.pop("path_qs", "/v1/x?a=%2F")),
        headers=headers,  # type: ignore[arg-type]
        body=body,
        **kw,  # type: ignore[arg-type]
    )


async def drain(resp: UpstreamResponse) -> bytes:
    if resp.body is not None:
        return resp.body
    assert resp.stream is not None
    return b"".join([c async for c in resp.stream])


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def serve_keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        _head, body = await read_request(reader)
        writer.write(ok_json(b'{"echo":"%s","n":%d}' % (body.decode().encode(), len(body))))
        await writer.drain()


async def test_reuses_one_connection_and_sends_the_request_as_given(kind: str) -> None:
    requests: list[tuple[bytes, bytes]] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            requests.append(await read_request(reader))
            writer.write(ok_json(b'{"n":%d}' % len(requests)))
            await writer.drain()

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)
    try:
        for i in range(5):
            resp = await tr.send(post(b'{"q":%d}' % i))
            assert resp.status == 200 and resp.reason == "OK"
            assert await drain(resp) == b'{"n":%d}' % (i + 1)
            assert resp.header("content-type") == "application/json"
        assert replica.connections == 1  # keep-alive: one connection for all five
        head, body = requests[0]
        assert head.startswith(b"POST /v1/x?a=%2F HTTP/1.1\r\n")  # the target byte for byte
        assert b"\r\nHost: 127.0.0.1:" in head and b"Content-Length: 7\r\n" in head
        assert body == b'{"q":0}'
        assert tr.pool_stats()["idle"] == 1 and tr.connections_in_use() == 0
    finally:
        await tr.aclose()
        await replica.stop()


async def test_streamed_request_body_goes_chunked_and_chunked_answers_stream(kind: str) -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _head, body = await read_request(reader)
        seen.append(body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep-alive: the client may come back

    async def parts() -> AsyncIterator[bytes]:
        for p in (b"ab", b"", b"cd"):
            yield p

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)
    try:
        resp = await tr.send(post(parts()))
        assert resp.stream is not None  # an event stream is never buffered
        assert await drain(resp) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert seen == [b"abcd"]
        assert tr.connections_in_use() == 0
    finally:
        await tr.aclose()
        await replica.stop()


async def test_body_until_close_head_and_informational_answers(kind: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        if head.startswith(b"HEAD"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n")
        elif b"/early" in head:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + ok_json())
        else:  # an HTTP/1.0-style body: no length, ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            await writer.drain()
            return
        await writer.drain()
        await reader.read()

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)
    try:
        assert await drain(await tr.send(post(None, method="GET", path_qs="/raw"))) == (
            b"until the end"
        )
        head = await tr.send(post(None, method="HEAD", path_qs="/h"))
        assert head.status == 200 and head.header("Content-Length") == "11"
        assert await drain(head) == b""
        if kind == "lean":  # aiohttp's client waits for its read timeout on a 1xx
            early = await tr.send(post(method="POST", path_qs="/early"))
            assert early.status == 200 and await drain(early) == b'{"ok":true}'
            assert early.header("Link") is None  # the hint's headers are not the answer's
    finally:
        await tr.aclose()
        await replica.stop()


async def test_a_slow_replica_times_out_and_a_short_deadline_travels(kind: str) -> None:
    got: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        got.append(head)
        await asyncio.sleep(3)

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url, read=0.3)
    try:
        with pytest.raises(UpstreamTimeout, match="timed out during request"):
            await tr.send(post())
        with pytest.raises(UpstreamTimeout):
            await tr.send(post(), deadline_s=0.2)  # tighter than the read timeout
        assert b"X-Latentgate-Deadline-Ms: 200\r\n" in got[1]
        assert tr.connections_in_use() == 0
    finally:
        await tr.aclose()
        await replica.stop()


async def test_broken_replicas_map_to_the_backend_errors(kind: str, tmp_path: Path) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        if b"/garbage" in head:
            writer.write(b"SPDY/9 nonsense\r\n\r\n")
        elif b"/cut" in head:  # promises 100 bytes, sends 5, dies
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
        elif b"/silent" in head:
            pass  # closes without a word
        await writer.drain()

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)
    try:
        with pytest.raises(UpstreamProtocolError):
            await tr.send(post(path_qs="/garbage"))
        with pytest.raises(UpstreamProtocolError):
            await drain(await tr.send(post(path_qs="/cut")))
        with pytest.raises(UpstreamProtocolError, match="closed the connection during request"):
            await tr.send(post(path_qs="/silent"))
        assert tr.connections_in_use() == 0
    finally:
        await tr.aclose()
        await replica.stop()
    dead = make(kind, url)
    try:
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await dead.send(post())
    finally:
        await dead.aclose()


async def test_an_abandoned_stream_closes_its_connection_and_a_unix_replica_works(
    kind: str, tmp_path: Path
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_request(reader)
            if b"/big" in head:
                chunk = b"x" * 65536
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (40 * len(chunk)))
                for _ in range(40):
                    writer.write(chunk)
                    await writer.drain()
            else:
                writer.write(ok_json())
                await writer.drain()

    replica = Replica(script)
    url = await replica.start(unix=tmp_path / "r.sock")
    tr = make(kind, url)
    try:
        big = await tr.send(post(path_qs="/big"))
        assert big.stream is not None  # over 1 MiB: streamed
        first = await big.stream.__anext__()  # type: ignore[attr-defined]
        assert first.startswith(b"x")
        await big.stream.aclose()  # dirty: must not go back to the pool
        assert await drain(await tr.send(post(path_qs="/small"))) == b'{"ok":true}'
        assert replica.connections == 2
    finally:
        await tr.aclose()
        await replica.stop()


async def test_header_values_cannot_split_the_request(kind: str) -> None:
    replica = Replica(serve_keepalive)
    url = await replica.start()
    tr = make(kind, url)
    try:
        with pytest.raises((UpstreamProtocolError, ValueError)):
            await tr.send(post(headers=[("X-Evil", "a\r\nX-Injected: 1")]))
    finally:
        await tr.aclose()
        await replica.stop()


async def test_the_pool_limit_queues_requests_and_a_failed_connect_frees_its_slot(
    kind: str,
) -> None:
    open_now: list[int] = [0]
    most: list[int] = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        try:
            while True:
                await read_request(reader)
                await asyncio.sleep(0.05)
                writer.write(ok_json())
                await writer.drain()
        finally:
            open_now[0] -= 1

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)  # max_connections=4
    try:
        answers = await asyncio.gather(*(tr.send(post()) for _ in range(12)))
        assert [r.status for r in answers] == [200] * 12
        assert most[0] <= 4 and replica.connections <= 4
    finally:
        await tr.aclose()
        await replica.stop()
    dead = make(kind, url)
    try:  # nothing listens any more: every caller hears so, none waits for a slot forever
        got = await asyncio.wait_for(
            asyncio.gather(*(dead.send(post()) for _ in range(8)), return_exceptions=True), 10
        )
        assert all(isinstance(e, UpstreamConnectError) for e in got)
    finally:
        await dead.aclose()


@pytest.mark.parametrize("when", ["while idle", "behind the answer"])
async def test_an_answer_nobody_asked_for_never_reaches_the_next_request(
    kind: str, when: str
) -> None:
    """A replica that sends a second response (after the first, or in the same write) has put
    the connection out of step: the next request, another client's, gets its own answer on a
    fresh connection, never the stray one."""
    served = 0

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        while True:
            _head, body = await read_request(reader)
            served += 1
            answer = ok_json(b'{"for":%s}' % body)
            if served == 1:
                stray = ok_json(b'{"poison":true}')
                if when == "behind the answer":
                    writer.write(answer + stray)
                else:
                    writer.write(answer)
                    await writer.drain()
                    await asyncio.sleep(0.1)
                    writer.write(stray)
            else:
                writer.write(answer)
            await writer.drain()

    replica = Replica(script)
    url = await replica.start()
    tr = make(kind, url)
    try:
        first = await tr.send(post(b'"a"'))
        assert await drain(first) == b'{"for":"a"}'
        await asyncio.sleep(0.3)  # the stray answer has arrived on the idle connection
        for client in (b'"b"', b'"c"'):
            resp = await tr.send(post(client))
            assert await drain(resp) == b'{"for":%s}' % client
        assert replica.connections == 2  # the out-of-step connection was not reused
    finally:
        await tr.aclose()
        await replica.stop()
