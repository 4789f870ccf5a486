"""The openai SDK through the gateway behaves exactly as against the upstream directly."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from tests.support.servers import ServerThread

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there gateway"},
]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


def test_chat_sync_same_as_direct(upstream: ServerThread, gateway: ServerThread) -> None:
    direct = _client(upstream.url).chat.completions.create(
        model="m", messages=MESSAGES, temperature=0
    )
    via = _client(gateway.url).chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    assert via.model_dump() == direct.model_dump()
    assert via.choices[0].message.content == "echo(up): hello there gateway"


def test_chat_stream_events_same_as_direct(upstream: ServerThread, gateway: ServerThread) -> None:
    def collect(url: str) -> list[dict[str, object]]:
        stream = _client(url).chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return [chunk.model_dump() for chunk in stream]

    direct, via = collect(upstream.url), collect(gateway.url)
    assert via == direct
    assert len(via) == 6  # role chunk, four words, finish chunk


async def test_async_sdk_stream_and_plain(upstream: ServerThread, gateway: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0)
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "echo(up): hello there gateway"
    comp = await client.completions.create(model="m", prompt="say hi")
    assert comp.choices[0].text == "echo(up): say hi"
    emb = await client.embeddings.create(model="m", input=["a", "b"])
    assert len(emb.data) == 2
    await client.close()


async def test_sse_event_boundaries_byte_identical(
    upstream: ServerThread, gateway: ServerThread
) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    headers = {"X-Test-Event-Delay": "0.02"}

    async def chunks(url: str) -> tuple[list[bytes], str]:
        got: list[bytes] = []
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            async for data, _ in r.content.iter_chunks():
                got.append(data)
            return got, r.headers["Content-Type"]

    direct, via = await chunks(upstream.url), await chunks(gateway.url)
    assert b"".join(via[0]) == b"".join(direct[0])
    assert via[1] == "text/event-stream"
    # Events arrive as they are produced (delayed upstream): never merged into one write.
    assert len(via[0]) >= 5


def test_error_status_and_body_verbatim(upstream: ServerThread, gateway: ServerThread) -> None:
    for url in (upstream.url, gateway.url):
        with pytest.raises(openai.RateLimitError) as info:
            _client(url).with_options(
                default_headers={"X-Test-Status": "429"}
            ).chat.completions.create(model="m", messages=MESSAGES)
        assert info.value.status_code == 429
        assert info.value.body == {
            "message": "injected 429",
            "type": "test_error",
            "param": None,
            "code": 429,
        }


async def test_raw_error_body_and_headers(upstream: ServerThread, gateway: ServerThread) -> None:
    async with aiohttp.ClientSession() as s:
        results = []
        for url in (upstream.url, gateway.url):
            async with s.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": MESSAGES},
                headers={"X-Test-Status": "503"},
            ) as r:
                results.append((r.status, await r.read(), r.headers.get("X-Upstream")))
        assert results[0] == results[1]


def test_keepalive_one_upstream_connection(upstream: ServerThread, gateway: ServerThread) -> None:
    client = _client(gateway.url)
    for i in range(100):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
    stats = upstream.call(_stats(upstream))
    assert stats["requests"]["/v1/chat/completions"] == 100
    assert stats["connections"] == 1


async def _stats(server: ServerThread) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(server.url + "/_test/stats") as r:
        return dict(await r.json())


async def test_concurrent_requests_reuse_pool(
    upstream: ServerThread, gateway: ServerThread
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)
    for _ in range(3):
        await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": str(i)}]
                )
                for i in range(8)
            ]
        )
    await client.close()
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        stats = await r.json()
    assert stats["requests"]["/v1/chat/completions"] == 24
    assert stats["connections"] <= 8
