"""Streaming through the exact cache, checked with the openai SDK (sync and async).

A miss streams live and is stored only after [DONE]; a hit replays at once as SSE, or as one
chat.completion when the client did not ask for a stream, and the other way round.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there gateway"}]
OTHER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x y"}]
TEXT = "echo(up): hello there gateway"


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url))


def _stream(
    url: str, headers: dict[str, str] | None = None
) -> tuple[str, list[dict[str, object]], dict[str, str]]:
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        temperature=0,
        extra_headers=headers or {},
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
        for c in openai_client(upstream.url).chat.completions.create(
            model="m", messages=MESSAGES, temperature=0, stream=True
        )
    ]
    assert (x1, x2) == ("miss", "hit")
    assert c1 == c2 == direct
    assert h2["content-type"].startswith("text/event-stream")
    # replayed at once: one length-delimited body, not a drip of chunks
    assert "content-length" in {k.lower() for k in h2}


def test_stored_stream_served_as_json_completion(upstream: ServerThread, gw: ServerThread) -> None:
    # A JSON body always carries usage: a stream stored with its usage chunk can serve it.
    openai_client(gw.url).chat.completions.create(
        model="m",
        messages=MESSAGES,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ).close()
    raw = openai_client(gw.url).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, temperature=0
    )
    comp = raw.parse()
    assert raw.headers["X-Cache"] == "hit"
    assert comp.usage is not None and comp.usage.total_tokens > 0
    assert comp.object == "chat.completion"
    assert comp.choices[0].message.content == TEXT
    assert comp.choices[0].message.role == "assistant"
    assert comp.choices[0].finish_reason == "stop"


async def test_stored_json_served_as_stream_async_sdk(
    upstream: ServerThread, gw: ServerThread
) -> None:
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    plain = await client.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        temperature=0,
        stream_options={"include_usage": True},
    )
    assert raw.headers["X-Cache"] == "hit"
    chunks = [c async for c in raw.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == TEXT
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage, expected = chunks[-1].usage, plain.usage
    assert usage is not None and expected is not None
    assert usage.total_tokens == expected.total_tokens
    # a stored stream without usage cannot give a JSON body its usage: a miss, which
    # completes the entry; the next JSON client is a hit
    live = await client.chat.completions.create(
        model="m", messages=OTHER, temperature=0, stream=True
    )
    assert [c.choices[0].finish_reason async for c in live][-1] == "stop"
    xs = []
    for _ in range(2):
        raw2 = await client.chat.completions.with_raw_response.create(
            model="m", messages=OTHER, temperature=0
        )
        xs.append(raw2.headers["X-Cache"])
        assert raw2.parse().choices[0].message.content == "echo(up): x y"
        assert raw2.parse().usage is not None
    assert xs == ["miss", "hit"]
    await client.close()


async def test_cut_stream_is_not_stored(upstream: ServerThread, gw: ServerThread) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True, "temperature": 0}
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


async def test_a_stream_that_failed_mid_generation_is_not_stored(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """vLLM and SGLang report an engine failure inside the stream (an error event) and still
    end it with [DONE]: each client sees what the replica sent it (waiters of the flight get
    their own answers, not a 502), and the cache keeps none of it."""
    body = {"model": "m", "messages": MESSAGES, "stream": True, "temperature": 0}
    failing = {"X-Test-Stream-Error": "2", "X-Test-Event-Delay": "0.1"}
    async with aiohttp.ClientSession() as s:

        async def ask(headers: dict[str, str]) -> tuple[int, str, bytes]:
            async with s.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                return r.status, r.headers["X-Cache"], await r.read()

        answers = await asyncio.gather(*(ask(failing) for _ in range(3)))  # one flight
        for status, x_cache, raw in answers:
            assert (status, x_cache) == (200, "miss"), raw
            assert b"CUDA out of memory" in raw and raw.rstrip().endswith(b"data: [DONE]")
        status, x_cache, raw = await ask({})
        assert (status, x_cache) == (200, "miss") and b"CUDA" not in raw


def test_completions_endpoint_both_framings(upstream: ServerThread, gw: ServerThread) -> None:
    client = openai_client(gw.url)
    first = client.completions.create(model="m", prompt="say hi", temperature=0)
    raw = client.completions.with_raw_response.create(
        model="m", prompt="say hi", temperature=0, stream=True
    )
    assert raw.headers["X-Cache"] == "hit"
    assert (
        "".join(c.choices[0].text for c in raw.parse())
        == first.choices[0].text
        == "echo(up): say hi"
    )


def _token_list(logprobs: object) -> list[tuple[str, float]]:
    content = getattr(logprobs, "content", None) or []
    return [(t.token, t.logprob) for t in content]


@pytest.mark.parametrize("first", ["stream", "plain"])
def test_logprobs_survive_a_hit_in_the_other_framing(
    upstream: ServerThread, gw: ServerThread, first: str
) -> None:
    """A stored stream served as one body (and the other way round) keeps the answer's token
    logprobs: what the upstream itself returns in that framing."""
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"logprobs {first}"}]
    direct = openai_client(upstream.url).chat.completions.create(
        model="m", messages=msgs, temperature=0, logprobs=True
    )
    want = _token_list(direct.choices[0].logprobs)
    assert len(want) > 2

    def plain() -> list[tuple[str, float]]:
        r = openai_client(gw.url).chat.completions.create(
            model="m", messages=msgs, temperature=0, logprobs=True
        )
        return _token_list(r.choices[0].logprobs)

    def stream() -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        for c in openai_client(gw.url).chat.completions.create(
            model="m",
            messages=msgs,
            temperature=0,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if c.choices:
                out += _token_list(c.choices[0].logprobs)
        return out

    calls = (stream, plain) if first == "stream" else (plain, stream)
    assert [f() for f in calls] == [want, want]

    async def count() -> int:
        async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
            return int((await r.json())["requests"]["/v1/chat/completions"])

    assert upstream.call(count()) == 2  # the direct call and the gateway's one miss


@pytest.mark.parametrize("stored_as_stream", [True, False])
def test_reasoning_and_legacy_function_calls_survive_either_framing(
    upstream: ServerThread, gw: ServerThread, stored_as_stream: bool
) -> None:
    """What vLLM's reasoning parsers add (reasoning_content), a web search's url_citation
    annotations and the legacy functions API's function_call come back from a hit in the other
    framing as the replica sent them."""
    client = openai_client(gw.url)
    tag = "s" if stored_as_stream else "j"
    reasoning = {
        "extra_headers": {
            "X-Test-Reasoning": "think first, then answer",
            "X-Test-Citation": "https://example.org/source",
        }
    }
    functions = [{"name": "lookup", "parameters": {"type": "object", "properties": {}}}]

    def ask(text: str, stream: bool, **kw: Any) -> tuple[str, dict[str, Any]]:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
        if not stream:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=messages, temperature=0, **kw
            )
            return raw.headers["X-Cache"], raw.parse().choices[0].message.model_dump()
        raw_s = client.chat.completions.with_raw_response.create(
            model="m",
            messages=messages,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},  # (a JSON answer needs the usage)
            **kw,
        )
        msg: dict[str, Any] = {
            "content": "",
            "reasoning_content": "",
            "function_call": None,
            "annotations": [],
        }
        for chunk in raw_s.parse():
            if not chunk.choices:
                continue  # the usage chunk
            d = chunk.choices[0].delta.model_dump()
            msg["content"] += d.get("content") or ""
            msg["reasoning_content"] += d.get("reasoning_content") or ""
            msg["annotations"] += d.get("annotations") or []
            if d.get("function_call"):
                fc = msg["function_call"] = msg["function_call"] or {"name": "", "arguments": ""}
                fc["name"] += d["function_call"].get("name") or ""
                fc["arguments"] += d["function_call"].get("arguments") or ""
        return raw_s.headers["X-Cache"], msg

    first, second = (True, False) if stored_as_stream else (False, True)
    x1, m1 = ask(f"why {tag}", first, **reasoning)
    x2, m2 = ask(f"why {tag}", second, **reasoning)
    assert (x1, x2) == ("miss", "hit")
    assert m1["reasoning_content"] == m2["reasoning_content"] == "think first, then answer"
    assert m1["annotations"] == m2["annotations"]
    assert [a["url_citation"]["url"] for a in m2["annotations"]] == ["https://example.org/source"]
    assert m2["content"] == m1["content"] == f"echo(up): why {tag}"

    x1, m1 = ask(f"find {tag}", first, functions=functions)
    x2, m2 = ask(f"find {tag}", second, functions=functions)
    assert (x1, x2) == ("miss", "hit")
    assert m1["function_call"] == m2["function_call"]
    assert m2["function_call"] == {"name": "lookup", "arguments": json.dumps({"q": f"find {tag}"})}
    assert not m2["content"]
