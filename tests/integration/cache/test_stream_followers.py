"""Identical streaming requests follow the leader's stream as it comes.

Before, an identical request that streamed too waited for the leader's whole answer: its first
token came after the leader's last, and a stream longer than coalesce_wait_s (30 s) cost it
those 30 s before it went upstream itself. Now it is sent the leader's stream live (what came
before it joined, then each event as it arrives), and still only one call goes upstream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import aiohttp
import pytest

from tests.fault.conftest import metric
from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

PATH = "/v1/chat/completions"


def chat(text: str, **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "stream": True,
        **extra,
    }


class Read:
    """One streamed response as the client saw it: the bytes, when each chunk came, and
    whether the stream ended cleanly."""

    def __init__(self) -> None:
        self.status = 0
        self.x_cache = ""
        self.body = b""
        self.times: list[float] = []
        self.cut = False
        self.first = asyncio.Event()


async def read_stream(
    s: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    headers: dict[str, str],
    out: Read,
    stop_after: int | None = None,
) -> None:
    async with s.post(url + PATH, json=body, headers=headers) as r:
        out.status, out.x_cache = r.status, r.headers.get("X-Cache", "")
        try:
            async for chunk in r.content.iter_any():
                out.body += chunk
                out.times.append(time.monotonic())
                out.first.set()
                if stop_after is not None and len(out.times) >= stop_after:
                    return  # the client leaves mid-stream
        except aiohttp.ClientPayloadError:
            out.cut = True


async def stalled_client(
    url: str, body: dict[str, object], headers: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a tiny receive window that sends `body` and then reads only what the
    caller reads (300 bytes, say): a stalled consumer."""
    raw = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(
        b"POST "
        + PATH.encode()
        + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: %d\r\n\r\n" % len(raw)
        + raw
    )
    await writer.drain()
    return reader, writer


def text_of(body: bytes) -> str:
    events = [e[6:] for e in body.split(b"\n\n") if e.startswith(b"data: {")]
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in map(json.loads, events)
        if c.get("choices")
    )


async def calls(upstream: ServerThread) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get(PATH, 0))


async def followed(gw: ServerThread) -> float:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith('latentgate_cache_singleflight_coalesced_total{outcome="followed"}'):
                return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("join", ["before_headers", "mid_stream"])
async def test_an_identical_streaming_request_follows_the_leaders_stream_live(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], join: str
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = chat(f"follow me {join}")
    # ~9 events 0.25 s apart; before_headers: the upstream first waits 1 s before answering
    slow = {"X-Test-Event-Delay": "0.25"}
    if join == "before_headers":
        slow["X-Test-Delay"] = "1"
    leader, follower = Read(), Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(read_stream(s, gw.url, body, slow, leader))
        if join == "mid_stream":
            await asyncio.wait_for(leader.first.wait(), 10)
        else:
            await asyncio.sleep(0.3)  # the leader is upstream, its headers not yet back
        await read_stream(s, gw.url, body, slow, follower)
        await first
    assert leader.status == follower.status == 200
    assert follower.body == leader.body and text_of(follower.body)
    assert follower.body.rstrip().endswith(b"data: [DONE]") and not follower.cut
    # live: the follower's first bytes came while the leader's stream was still going
    assert follower.times[0] < leader.times[-1]
    assert len(follower.times) > 1  # and not as one replayed block
    assert await calls(upstream) == 1
    assert await followed(gw) == 1
    # the recording was stored as usual: the next one is a hit, the same stream
    later = Read()
    async with aiohttp.ClientSession() as s:
        await read_stream(s, gw.url, body, {}, later)
    assert later.x_cache == "hit" and text_of(later.body) == text_of(leader.body)


async def test_a_follower_is_cut_with_the_leaders_stream_and_nothing_is_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = chat("cut us both")
    cut = {"X-Test-Event-Delay": "0.25", "X-Test-Cut-Stream": "4"}
    leader, follower = Read(), Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(read_stream(s, gw.url, body, cut, leader))
        await asyncio.wait_for(leader.first.wait(), 10)
        await read_stream(s, gw.url, body, cut, follower)
        await first
    # neither client is told a cut stream was whole: no [DONE], the connection closed early
    for got in (leader, follower):
        assert got.status == 200 and b"[DONE]" not in got.body
    assert follower.cut
    assert await calls(upstream) == 1
    # one upstream failure, counted once (not once per client that was sent it)
    assert await metric(gw.url, "latentgate_upstream_errors_total", kind="stream_cut") == 1
    again = Read()
    async with aiohttp.ClientSession() as s:
        await read_stream(s, gw.url, body, {}, again)
    assert again.x_cache == "miss" and again.body.rstrip().endswith(b"data: [DONE]")


async def test_a_follower_gets_the_whole_stream_when_the_leaders_client_leaves(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = chat("stay with me")
    slow = {"X-Test-Event-Delay": "0.25"}
    leader, follower = Read(), Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(read_stream(s, gw.url, body, slow, leader, stop_after=1))
        await asyncio.wait_for(leader.first.wait(), 10)
        await read_stream(s, gw.url, body, slow, follower)
        await first
    assert follower.body.rstrip().endswith(b"data: [DONE]") and text_of(follower.body)
    assert await calls(upstream) == 1
    later = Read()
    async with aiohttp.ClientSession() as s:
        await read_stream(s, gw.url, body, {}, later)
    assert later.x_cache == "hit" and text_of(later.body) == text_of(follower.body)


async def test_a_stream_in_another_framing_waits_and_never_gets_the_leaders_usage_chunk(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The leader asked for the usage chunk, the other request did not: the leader's bytes are
    not its answer, so it waits for the whole recording and gets it without usage."""
    gw = start_gateway(cache_config(upstream.url))
    slow = {"X-Test-Event-Delay": "0.25"}
    leader, other = Read(), Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(
            read_stream(
                s,
                gw.url,
                chat("usage framing", stream_options={"include_usage": True}),
                slow,
                leader,
            )
        )
        await asyncio.wait_for(leader.first.wait(), 10)
        await read_stream(s, gw.url, chat("usage framing"), slow, other)
        await first
    assert b'"usage"' in leader.body and b'"usage"' not in other.body
    assert text_of(other.body) == text_of(leader.body)
    assert other.times[0] >= leader.times[-1]  # it waited for the whole answer
    assert await calls(upstream) == 1
    assert await followed(gw) == 0


async def one_body(url: str, body: dict[str, object]) -> tuple[int, str, str, float]:
    async with aiohttp.ClientSession() as s, s.post(url + PATH, json=body) as r:
        doc = await r.json()
        text = doc["choices"][0]["message"]["content"] if r.status == 200 else ""
        return r.status, r.headers.get("X-Cache", ""), text, time.monotonic()


async def test_a_client_that_stops_reading_holds_back_no_other_client(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """A streams a large answer and stops reading after its first bytes (a stalled consumer);
    B asks the same question for one body. B is answered from A's flight when the upstream is
    done, not when A's client has read it all: before, B waited out coalesce_wait_s and called
    the upstream itself (and with a short route total got a 502 blamed on the upstream)."""
    cfg = cache_config(upstream.url, max_entry_bytes=64 << 20, coalesce_wait_s=20)
    # The upstream, the gateway and both clients share this process's GIL: the 19 MB stream
    # takes 12-19 s here (3.5 s from the upstream alone), past the tests' usual 10 s total.
    cfg["backends"]["upstream"]["timeouts"]["total"] = 120
    gw = start_gateway(cfg)
    words = " ".join(["word"] * 100_000)  # a ~19 MB stream: far more than the sockets buffer
    # (with its usage chunk: an OpenAI stream makes a one-body answer only with it)
    body = chat(words, stream_options={"include_usage": True})
    reader, writer = await stalled_client(gw.url, body)
    assert (await reader.read(300)).startswith(b"HTTP/1.1 200")  # ... and A reads no more
    try:
        one = {k: v for k, v in body.items() if k != "stream_options"}
        status, x_cache, text, _ = await one_body(gw.url, {**one, "stream": False})
        # (a "hit" when A's flight was stored before B's lookup on a slow machine: B was not
        # held back either way; held back, it would have called the upstream itself)
        assert status == 200 and x_cache in ("miss", "hit") and text.endswith("word")
        assert await calls(upstream) == 1  # A's call answered B
    finally:
        writer.close()


async def test_waiters_go_upstream_as_soon_as_a_stream_outgrows_the_store(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """A stream larger than max_entry_bytes is neither kept nor shared: a request waiting on it
    computes its own answer as soon as that is known, not after the stream's last byte."""
    gw = start_gateway(cache_config(upstream.url, max_entry_bytes=2000))
    body = chat(" ".join(["long" * 100] * 8))  # ~10 events, 8 of ~0.5 KB, 0.25 s apart
    leader = Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(
            read_stream(s, gw.url, body, {"X-Test-Event-Delay": "0.25"}, leader)
        )
        await asyncio.wait_for(leader.first.wait(), 10)
        status, x_cache, text, done_at = await one_body(gw.url, {**body, "stream": False})
        await first
    assert status == 200 and x_cache == "miss" and text.endswith("longlong")
    assert done_at < leader.times[-1]  # it did not wait for the leader's last byte
    assert await calls(upstream) == 2


async def test_a_follower_that_stops_reading_is_cut_not_the_leader(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """A follower that stops reading falls behind an ~8 MB stream (over max_entry_bytes, so
    kept by nobody): it is cut when it is more than max(max_entry_bytes, 1 MiB) behind, and the
    leader, reading at full speed, gets the whole stream. Before, the pump waited for the
    follower and the leader was cut at the route's total."""
    gw = start_gateway(cache_config(upstream.url))
    body = chat(" ".join(["word"] * 40_000))
    leader = Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(read_stream(s, gw.url, body, {"X-Test-Delay": "1"}, leader))
        await asyncio.sleep(0.3)  # the leader is upstream, its headers not yet back
        reader, writer = await stalled_client(gw.url, body, b"X-Test-Delay: 1\r\n")
        try:
            assert (await reader.read(300)).startswith(b"HTTP/1.1 200")  # ... and no more
            await first
        finally:
            writer.close()
    assert not leader.cut and leader.body.rstrip().endswith(b"data: [DONE]")
    assert await calls(upstream) == 1
    # a client cut for lagging is no upstream failure
    assert await metric(gw.url, "latentgate_upstream_errors_total", kind="stream_cut") == 0


async def test_a_leader_that_stops_reading_is_cut_not_its_follower(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The other way round: the leader's client stalls, the follower reads at full speed and
    gets the whole stream; the leader's cut is not counted as an upstream failure."""
    gw = start_gateway(cache_config(upstream.url))
    body = chat(" ".join(["word"] * 40_000))
    reader, writer = await stalled_client(gw.url, body, b"X-Test-Delay: 1\r\n")
    follower = Read()
    try:
        await asyncio.sleep(0.3)  # the leader is upstream, its headers not yet back
        async with aiohttp.ClientSession() as s:
            await read_stream(s, gw.url, body, {"X-Test-Delay": "1"}, follower)
        assert (await reader.read(300)).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    assert not follower.cut and follower.body.rstrip().endswith(b"data: [DONE]")
    assert await calls(upstream) == 1
    assert await metric(gw.url, "latentgate_upstream_errors_total", kind="stream_cut") == 0


async def test_a_cut_is_counted_when_the_leaders_client_has_left(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = chat("cut after the leader left")
    cut = {"X-Test-Event-Delay": "0.25", "X-Test-Cut-Stream": "5"}
    leader, follower = Read(), Read()
    async with aiohttp.ClientSession() as s:
        await read_stream(s, gw.url, body, cut, leader, stop_after=1)  # ... and it leaves
        await read_stream(s, gw.url, body, cut, follower)
    assert follower.cut and await calls(upstream) == 1
    assert await metric(gw.url, "latentgate_upstream_errors_total", kind="stream_cut") == 1


async def in_flight(upstream: ServerThread) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["in_flight"])


async def test_a_stream_nobody_reads_or_keeps_any_more_frees_the_upstream(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The leader's client leaves while its answer could still be kept (the store reads on for
    it); then the answer outgrows max_entry_bytes: nobody wants the rest, so the gateway stops
    reading and the replica's stream ends, long before the 20 s it would take (and the
    route's 10 s total). Before, it was read on to the total."""
    gw = start_gateway(cache_config(upstream.url, max_entry_bytes=4000))
    body = chat(" ".join(["long" * 100] * 80))  # 80 events of ~0.5 KB, 0.25 s apart
    leader = Read()
    async with aiohttp.ClientSession() as s:
        await read_stream(s, gw.url, body, {"X-Test-Event-Delay": "0.25"}, leader, stop_after=1)
    for _ in range(50):  # polled: ~0.1 s per look, at most ~5 s, half the route's total
        if await in_flight(upstream) == 0:
            break
        await asyncio.sleep(0.1)
    assert await in_flight(upstream) == 0


async def test_another_tenants_identical_stream_is_not_followed(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The same body under another credential is another tenant's key: it neither follows nor
    waits on the first tenant's stream, and calls the upstream itself."""
    gw = start_gateway(cache_config(upstream.url))
    body = chat("whose stream is it")
    slow = {"X-Test-Event-Delay": "0.25"}
    alice, bob = Read(), Read()
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(
            read_stream(s, gw.url, body, {**slow, "Authorization": "Bearer sk-alice"}, alice)
        )
        await asyncio.wait_for(alice.first.wait(), 10)
        await read_stream(s, gw.url, body, {**slow, "Authorization": "Bearer sk-bob"}, bob)
        await first
    assert alice.x_cache == bob.x_cache == "miss" and text_of(bob.body) == text_of(alice.body)
    assert await calls(upstream) == 2
    assert await followed(gw) == 0
