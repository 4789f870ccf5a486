"""Streaming through the exact cache, checked with the openai SDK (sync and async).

A miss streams live and is stored only after [DONE]; a hit replays at once as SSE, or as one
chat.completion when the client did not ask for a stream, and the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.protocols.openai_sse import body_to_events, events_to_body
from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there gateway"}]
OTHER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x y"}]
TEXT = "echo(up): hello there gateway"


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url))


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


def _stream(
    url: str, headers: dict[str, str] | None = None
) -> tuple[str, list[dict[str, object]], dict[str, str]]:
    raw = _client(url).chat.completions.with_raw_response.create(
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
        for c in _client(upstream.url).chat.completions.create(
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
    _client(gw.url).chat.completions.create(
        model="m",
        messages=MESSAGES,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ).close()
    raw = _client(gw.url).chat.completions.with_raw_response.create(
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


def test_completions_endpoint_both_framings(upstream: ServerThread, gw: ServerThread) -> None:
    client = _client(gw.url)
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
    direct = _client(upstream.url).chat.completions.create(
        model="m", messages=msgs, temperature=0, logprobs=True
    )
    want = _token_list(direct.choices[0].logprobs)
    assert len(want) > 2

    def plain() -> list[tuple[str, float]]:
        r = _client(gw.url).chat.completions.create(
            model="m", messages=msgs, temperature=0, logprobs=True
        )
        return _token_list(r.choices[0].logprobs)

    def stream() -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        for c in _client(gw.url).chat.completions.create(
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


def test_a_streamed_tool_call_keeps_a_null_content_when_served_as_one_body() -> None:
    events = [
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function",'
        b'"function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}',
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
        b"data: [DONE]",
    ]
    body = events_to_body(events, "chat")
    assert body is not None
    msg = json.loads(body)["choices"][0]["message"]
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "f"


def test_completions_logprobs_round_trip_between_stream_and_body() -> None:
    lp = {"tokens": ["a", " b"], "token_logprobs": [-0.1, -0.2], "text_offset": [0, 1]}
    body = json.dumps(
        {
            "id": "x",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "a b", "logprobs": lp, "finish_reason": "stop"}],
        }
    ).encode()
    events = body_to_events(body, "completions")
    assert events is not None
    back = events_to_body(events, "completions")
    assert back is not None and json.loads(back)["choices"][0]["logprobs"] == lp
    # and a stream that carried them chunk by chunk joins them in order
    chunks = [
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-0.1],"text_offset":[0]},'
        b'"finish_reason":null}]}',
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" b","logprobs":{"tokens":[" b"],"token_logprobs":[-0.2],"text_offset":[1]},'
        b'"finish_reason":"stop"}]}',
        b"data: [DONE]",
    ]
    joined = events_to_body(chunks, "completions")
    assert joined is not None and json.loads(joined)["choices"][0]["logprobs"] == lp
