"""Streaming through the exact cache, checked with the openai SDK (sync and async).

A miss streams live and is stored only after [DONE]; a hit replays at once as SSE, or as one
chat.completion when the client did not ask for a stream, and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import openai
import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

MESSAGES = [{"role": "user", "content": "hello there gateway"}]
TEXT = "echo(up): hello there gateway"


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url))


def _client(url: str, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, **kw)  # type: ignore[arg-type]


def _stream(
    url: str, headers: dict[str, str] | None = None
) -> tuple[str, list[dict[str, object]], dict[str, str]]:
    raw = _client(url).chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        extra_headers=headers or {},  # type: ignore[arg-type]
    )
    chunks = [c.model_dump() for c in raw.parse()]
    return raw.headers.get("X-Cache", ""), chunks, dict(raw.headers)


def test_stream_miss_then_stream_hit_identical_events(
    upstream: ServerThread, gw: ServerThread
) -> None:
    x1, c1, _ = _stream(gw.url)
    x2, c2, h2 = _stream(gw.url)
    direct = [
        c.model_dump()
        for c in _client(upstream.url).chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
    ]  # type: ignore[arg-type]
    assert (x1, x2) == ("miss", "hit")
    assert c1 == c2 == direct
    assert h2["content-type"].startswith("text/event-stream")
    # replayed at once: one length-delimited body, not a drip of chunks
    assert "content-length" in {k.lower() for k in h2}


def test_stored_stream_served_as_json_completion(upstream: ServerThread, gw: ServerThread) -> None:
    _stream(gw.url)
    raw = _client(gw.url).chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    comp = raw.parse()
    assert raw.headers["X-Cache"] == "hit"
    assert comp.object == "chat.completion"
    assert comp.choices[0].message.content == TEXT
    assert comp.choices[0].message.role == "assistant"
    assert comp.choices[0].finish_reason == "stop"


async def test_stored_json_served_as_stream_async_sdk(
    upstream: ServerThread, gw: ServerThread
) -> None:
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    plain = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    raw = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    assert raw.headers["X-Cache"] == "hit"
    chunks = [c async for c in raw.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == TEXT
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.total_tokens == plain.usage.total_tokens
    )  # type: ignore[union-attr]
    # and a stored stream served to the async client without a stream
    await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x y"}], stream=True
    )  # type: ignore[arg-type]
    raw2 = await client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "x y"}]
    )  # type: ignore[arg-type]
    assert raw2.headers["X-Cache"] == "hit"
    assert raw2.parse().choices[0].message.content == "echo(up): x y"
    await client.close()


async def test_cut_stream_is_not_stored(upstream: ServerThread, gw: ServerThread) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(
                gw.url + "/v1/chat/completions", json=body, headers={"X-Test-Cut-Stream": "2"}
            ) as r:
                assert r.headers["X-Cache"] == "miss"
                await r.read()
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.headers["X-Cache"] == "miss"
            assert (await r.read()).rstrip().endswith(b"data: [DONE]")
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.headers["X-Cache"] == "hit"


def test_completions_endpoint_both_framings(upstream: ServerThread, gw: ServerThread) -> None:
    client = _client(gw.url)
    first = client.completions.create(model="m", prompt="say hi")
    raw = client.completions.with_raw_response.create(model="m", prompt="say hi", stream=True)
    assert raw.headers["X-Cache"] == "hit"
    assert (
        "".join(c.choices[0].text for c in raw.parse())
        == first.choices[0].text
        == "echo(up): say hi"
    )
