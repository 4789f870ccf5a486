"""A stored stream whose answer calls a custom tool is that call when served as one body.

OpenAI's custom tools (`tools: [{"type": "custom", ...}]`) are called with free text, not JSON
arguments: the body's call is `{"id", "type": "custom", "custom": {"name", "input"}}`, and the
stream sends the same object in pieces, `custom.input` split across chunks. The stream was
assembled as if every call were a function's: a non-streaming client served a stored stream
got a call of type custom with an empty `function` and no `custom` at all, its input lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.replies import openai_sse
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running

HEAD = {"id": "chatcmpl-c1", "created": 1700000000, "model": "gpt-test"}
TOOLS: list[Any] = [{"type": "custom", "custom": {"name": "shell"}}]
CALLS = [("call_1", "echo hello world"), ("call_2", "ls -la /tmp")]


def _body() -> dict[str, Any]:
    calls = [
        {"id": i, "type": "custom", "custom": {"name": "shell", "input": text}} for i, text in CALLS
    ]
    message = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
    usage = {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}
    return {**HEAD, "object": "chat.completion", "choices": [choice], "usage": usage}


def _deltas() -> list[dict[str, Any]]:
    """Two calls, as the API streams them: each opens with its id, type and name, then its
    input comes in pieces."""
    out: list[dict[str, Any]] = [{"role": "assistant", "content": None, "refusal": None}]
    for n, (call_id, text) in enumerate(CALLS):
        opening = {"name": "shell", "input": ""}
        out.append(
            {"tool_calls": [{"index": n, "id": call_id, "type": "custom", "custom": opening}]}
        )
        for piece in (text[:4], text[4:9], text[9:]):
            out.append({"tool_calls": [{"index": n, "custom": {"input": piece}}]})
    return out


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(_body())
    parts = [({"delta": d, "finish_reason": None}) for d in _deltas()]
    parts.append({"delta": {}, "finish_reason": "tool_calls"})
    chunks = [
        {**HEAD, "object": "chat.completion.chunk", "choices": [{"index": 0, **p}]} for p in parts
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(
            {**HEAD, "object": "chat.completion.chunk", "choices": [], "usage": _body()["usage"]}
        )
    return await openai_sse(request, chunks)


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _chat)) as server:
        yield server


def test_a_stored_custom_tool_stream_is_the_upstreams_body(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    kw: dict[str, Any] = {
        "model": "m",
        "temperature": 0,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "Say hello, then list /tmp"}],
    }
    stream = openai_client(gw.url).chat.completions.with_raw_response.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    assert stream.headers["X-Cache"] == "miss"
    list(stream.parse())  # read to its end: the recording is stored
    raw = openai_client(gw.url).chat.completions.with_raw_response.create(**kw)
    assert raw.headers["X-Cache"] == "hit"
    served = raw.parse()
    direct = openai_client(upstream.url).chat.completions.create(**kw)
    calls = served.choices[0].message.tool_calls or []
    assert [(c.type, c.custom.name, c.custom.input) for c in calls if c.type == "custom"] == [
        ("custom", "shell", text) for _, text in CALLS
    ]
    assert served.model_dump() == direct.model_dump()
