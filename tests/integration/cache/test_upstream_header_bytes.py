"""Header bytes a replica sends that the gateway must not pass on as they came: a control
character or DEL in a header or the status line is a JSON 502 (not a dropped connection and a
cached entry the hits replay), and a non-ASCII value reaches the client as the same bytes on the
miss and on every hit. Run on both HTTP/1.1 transports, against a loopback replica that writes
its answers byte for byte (aiohttp's server would not send these)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

CHAT = json.dumps(
    {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "header bytes"}]}
).encode()
ANSWER = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


class RawReplica:
    """Answers every request with `status_line` and `extra` header bytes as given."""

    def __init__(self, status_line: bytes, extra: bytes) -> None:
        self.head = status_line + b"\r\nContent-Type: application/json\r\n" + extra
        self.calls = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[Any]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if (task := asyncio.current_task()) is not None:
            self.tasks.append(task)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).lower()
                length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.calls += 1
                writer.write(self.head + b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def replica_at(replica: RawReplica) -> AsyncIterator[str]:
    server = await asyncio.start_server(replica.serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for w in replica.writers:  # keep-alive connections the gateway still holds
            w.close()
        await asyncio.gather(*replica.tasks, return_exceptions=True)


def gateway_config(url: str, client: str) -> dict[str, Any]:
    cfg = cache_config(url, tiers=["memory"], routes=("chat",))
    cfg["backends"]["upstream"]["pool"] = {"http_client": client}
    return cfg


async def exchange(port: int) -> tuple[bytes, bytes]:
    """(head, body) of one chat request's answer, as the bytes arrived; b"" for a dropped
    connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(CHAT) + CHAT
        )
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return b"", b""
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)
    finally:
        writer.close()


def field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b": ")
        if key.lower() == name.lower():
            return value
    return None


@pytest.fixture(params=["lean", "aiohttp"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize(
    ("status_line", "extra"),
    [
        (b"HTTP/1.1 200 OK", b"X-Bad: a\x7fb\r\n"),
        (b"HTTP/1.1 200 OK", b"X-Bad: a\x01b\r\n"),
        (b"HTTP/1.1 200 O\x7fK", b""),
    ],
    ids=["del-in-value", "ctl-in-value", "del-in-reason"],
)
async def test_a_control_character_from_the_replica_is_a_json_502_and_nothing_cached(
    start_gateway: Callable[..., ServerThread], client: str, status_line: bytes, extra: bytes
) -> None:
    replica = RawReplica(status_line, extra)
    async with replica_at(replica) as url:
        gw = start_gateway(gateway_config(url, client))
        for _ in range(2):  # the second is no hit of the first: nothing was stored
            head, body = await exchange(gw.port)
            assert head.startswith(b"HTTP/1.1 502 "), (head, body)
            assert field(head, b"Content-Type") == b"application/json"
            message = json.loads(body)["error"]["message"]
            assert "\x7f" not in message and "\x01" not in message  # not echoed back
            assert field(head, b"X-Bad") is None
        calls = replica.calls
        head, _ = await exchange(gw.port)
        assert replica.calls > calls  # asked again: still nothing in the cache


@pytest.mark.parametrize(
    ("sent", "delivered"),
    [
        (b"caf\xc3\xa9 \xe6\x97\xa5", b"caf\xc3\xa9 \xe6\x97\xa5"),  # UTF-8: byte for byte
        (b"caf\xe9", b"caf\xc3\xa9"),  # a lone latin-1 byte: no writer can send it as it came
    ],
    ids=["utf-8", "latin-1"],
)
async def test_a_non_ascii_header_value_is_the_same_bytes_on_the_miss_and_the_hit(
    start_gateway: Callable[..., ServerThread], client: str, sent: bytes, delivered: bytes
) -> None:
    replica = RawReplica(b"HTTP/1.1 200 OK", b"X-Name: " + sent + b"\r\n")
    async with replica_at(replica) as url:
        gw = start_gateway(gateway_config(url, client))
        miss, miss_body = await exchange(gw.port)
        hit, hit_body = await exchange(gw.port)
    assert field(miss, b"X-Cache") == b"miss" and field(hit, b"X-Cache") == b"hit"
    assert replica.calls == 1 and hit_body == miss_body == ANSWER
    assert field(miss, b"X-Name") == field(hit, b"X-Name") == delivered
