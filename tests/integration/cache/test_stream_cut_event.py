"""A stream whose upstream fails after its headers went out ends in the route's error event.

The gateway closed the connection without the terminating chunk: an HTTP/1.1 client saw a
connection error (the OpenAI SDK's "Connection error."), and an HTTP/1.0 client, whose body
ends where the connection does, saw what looks like a whole answer, its last events missing.
Now the cut stream ends in the error event the route's SDK raises (OpenAI: a `data:` object
with an `error`; Anthropic: an `error` event), for the leader's client and its followers, and
the connection is still closed early; nothing is stored.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.integration.cache.fleet import until, upstream_calls
from tests.support.sdk_clients import (  # noqa: F401 (autouse)
    anthropic_client,
    close_tracked_clients,
    openai_client,
)
from tests.support.servers import ServerThread, one_route, running

CHAT = "/v1/chat/completions"
CUT = {"X-Test-Event-Delay": "0.4", "X-Test-Cut-Stream": "4"}


def _openai_stream(url: str, text: str) -> tuple[int, str]:
    """Chunks read, and the error the SDK raised at the end ("" for none)."""
    stream = openai_client(url).chat.completions.create(
        model="m",
        temperature=0,
        messages=[{"role": "user", "content": text}],
        stream=True,
        extra_headers=CUT,
    )
    n = 0
    try:
        for _ in stream:
            n += 1
    except openai.APIConnectionError as exc:
        return n, f"connection: {exc}"
    except openai.APIError as exc:
        return n, exc.message
    return n, ""


def test_the_openai_sdk_raises_the_cut_for_the_leader_and_its_follower(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    text = "a stream the upstream cuts short"
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(_openai_stream, gw.url, text)
        # the leader's stream is under way (an event every 0.4 s): not a fixed sleep, which a
        # loaded machine's late leader outlasts
        until(lambda: upstream_calls(upstream, CHAT) == 1, "the leader's call went upstream")
        follower = pool.submit(_openai_stream, gw.url, text).result()
        got = leader.result()
    for n, error in (got, follower):
        assert n == 4 and "stream cut mid-way" in error, error
    assert upstream_calls(upstream, CHAT) == 1  # the second call followed the leader's
    # nothing partial was stored: the next call goes upstream and gets a whole answer
    again = openai_client(gw.url).chat.completions.with_raw_response.create(
        model="m", temperature=0, messages=[{"role": "user", "content": text}], stream=True
    )
    chunks = list(again.parse())
    assert again.headers["X-Cache"] == "miss" and chunks[-1].choices[0].finish_reason == "stop"


def test_an_http_1_0_client_is_told_its_stream_was_cut(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    body = json.dumps(
        {
            "model": "m",
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": "an old client's stream"}],
        }
    ).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"X-Test-Cut-Stream: 3\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        data = b""
        while chunk := s.recv(65536):  # the body ends where the connection does
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    events = [e for e in rest.split(b"\n\n") if e.strip()]
    assert len(events) == 4 and b"[DONE]" not in rest
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert "stream cut mid-way" in last["error"]["message"]


@pytest.fixture
def messages_gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


def test_the_anthropic_sdk_raises_the_cut(messages_gw: ServerThread) -> None:
    with pytest.raises(anthropic.APIStatusError, match="stream cut mid-way"):  # noqa: SIM117
        with anthropic_client(messages_gw.url).messages.stream(
            model="claude-test",
            max_tokens=64,
            messages=[{"role": "user", "content": "cut this message short"}],
            extra_headers=CUT,
        ) as stream:
            for _ in stream:
                pass


async def _sized_stream_cut_short(request: web.Request) -> web.StreamResponse:
    """An event stream with a Content-Length (as a cache in front of the model sends a stored
    one) whose connection drops 40 bytes short of it."""
    await request.read()
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    choice = {"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}
    event = b"data: " + json.dumps({**chunk, "choices": [choice]}).encode() + b"\n\n"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.content_length = 2 * len(event) + 40
    await resp.prepare(request)
    await resp.write(event * 2)
    assert request.transport is not None
    request.transport.close()
    return resp


async def test_a_sized_stream_cut_short_is_still_short(
    start_gateway: Callable[..., ServerThread],
) -> None:
    """The error event is not written into what is left of a Content-Length: it was cut to fit,
    so the client got every byte the length promised (a whole answer to its HTTP library, whose
    last event, cut short, the SDK drops) instead of a body that ends early."""
    with running(one_route("/v1/chat/completions", _sized_stream_cut_short)) as up:
        gw = start_gateway(cache_config(up.url, tiers=["memory"]))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/v1/chat/completions", json=body) as r,
        ):
            assert r.status == 200 and r.content_length is not None
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
