"""A hit in the other framing says what the upstream's own answer in that framing says.

The upstream here answers as OpenAI does: a tool call's message has `content: null`, and its
stream opens with `content: null` (a text answer's with ""); every message has `refusal: null`
and `annotations: []` (its stream says only `refusal: null`, on the first delta);
`service_tier` (the tier that served the call, "default" where the request said "auto") is on
the body and on every chunk.
A stored JSON answer replayed as a stream, accumulated by the SDK's `chat.completions.stream()`,
and a stored stream replayed as one body must give the SDK what the upstream itself gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from aiohttp import web
from openai import omit
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.integration.cache.conftest import cache_config
from tests.support.replies import openai_sse
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
ARGS = '{"city": "Paris"}'
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def _answer(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the message and finish reason, the deltas of its stream) for this request."""
    if body.get("tools"):
        message = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
        message["tool_calls"] = [{**CALL, "function": {**CALL["function"], "arguments": ARGS}}]
        opening = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **CALL}]}
        deltas: list[dict[str, Any]] = [
            {**opening, "refusal": None},
            {"tool_calls": [{"index": 0, "function": {"arguments": ARGS}}]},
        ]
        return {"message": message, "finish_reason": "tool_calls"}, deltas
    message = {"role": "assistant", "content": "Sunny.", "refusal": None, "annotations": []}
    deltas = [{"role": "assistant", "content": "", "refusal": None}, {"content": "Sunny."}]
    return {"message": message, "finish_reason": "stop"}, deltas


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    head = {
        "id": "chatcmpl-7",
        "created": 1700000000,
        "model": "gpt-test",
        "service_tier": "default",
        "system_fingerprint": "fp_7",
    }
    answer, deltas = _answer(body)
    if not body.get("stream"):
        choice = {"index": 0, "logprobs": None, **answer}
        doc = {**head, "object": "chat.completion", "choices": [choice], "usage": USAGE}
        return web.json_response(doc)
    head = {**head, "object": "chat.completion.chunk"}
    finish = {"delta": {}, "finish_reason": answer["finish_reason"]}
    parts = [*({"delta": d, "finish_reason": None} for d in deltas), finish]
    chunks = [{**head, "choices": [{"index": 0, "logprobs": None, **part}]} for part in parts]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": USAGE})
    return await openai_sse(request, chunks)


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _chat)) as server:
        yield server


def _streamed(c: openai.OpenAI, **kw: Any) -> tuple[dict[str, Any], list[str], str]:
    """The completion the SDK's stream helper accumulates, its event types, and X-Cache."""
    raw = c.chat.completions.with_raw_response.create(
        model="m", temperature=0, stream=True, stream_options={"include_usage": True}, **kw
    )
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(
        input_tools=kw.get("tools") or omit
    )
    kinds = [event.type for chunk in raw.parse() for event in state.handle_chunk(chunk)]
    return state.get_final_completion().model_dump(), kinds, raw.headers.get("X-Cache", "")


def _plain(c: openai.OpenAI, **kw: Any) -> tuple[dict[str, Any], str]:
    raw = c.chat.completions.with_raw_response.create(model="m", temperature=0, **kw)
    return raw.parse().model_dump(), raw.headers.get("X-Cache", "")


def _gateway_and_call(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], tools: Any
) -> tuple[ServerThread, dict[str, Any]]:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": "Weather?"}]}
    if tools:
        kw["tools"] = tools
    return gw, kw


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tool-call", "text"])
def test_a_stored_body_streams_as_the_upstream_streams(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], tools: Any
) -> None:
    gw, kw = _gateway_and_call(upstream, start_gateway, tools)
    direct = _streamed(openai_client(upstream.url), **kw)
    assert _plain(openai_client(gw.url), **kw)[1] == "miss"
    final, kinds, x_cache = _streamed(openai_client(gw.url), **kw)
    assert x_cache == "hit"
    assert final["service_tier"] == "default"
    assert (
        final["choices"][0]["message"]["content"] == direct[0]["choices"][0]["message"]["content"]
    )
    # the SDK saw no content event a tool call's stream does not have
    assert ("content.delta" in kinds) == ("content.delta" in direct[1])
    assert final == direct[0]


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tool-call", "text"])
def test_a_stored_stream_is_the_upstreams_body(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], tools: Any
) -> None:
    gw, kw = _gateway_and_call(upstream, start_gateway, tools)
    assert _streamed(openai_client(gw.url), **kw)[2] == "miss"
    body, x_cache = _plain(openai_client(gw.url), **kw)
    direct, _ = _plain(openai_client(upstream.url), **kw)
    assert x_cache == "hit"
    assert body["service_tier"] == direct["service_tier"] == "default"
    # `annotations` is [] as the upstream's own body has it (it was None: iterating failed)
    assert body["choices"][0]["message"]["annotations"] == []
    assert body["choices"] == direct["choices"]
