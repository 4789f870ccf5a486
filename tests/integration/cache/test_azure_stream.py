"""A stored Azure OpenAI stream served as one body says the answer's id, created and model.

Azure OpenAI opens a chat stream with a chunk of no choices for its prompt filter, whose id and
model are "" and created 0 (`prompt_filter_results`), then the answer's chunks, each choice with
its `content_filter_results`. A stored stream
served to a non-streaming openai.AzureOpenAI client took id, created and model from that first
chunk: "", 0 and "" where Azure's own body says chatcmpl-..., its time and the model, and it
dropped the filter results; a stored body served as a stream dropped the choice's too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.replies import openai_sse
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running

HEAD = {"id": "chatcmpl-az1", "created": 1700000000, "model": "gpt-4o-2024-11-20"}
FILTERS = [{"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False}}}]
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
SAFE = {"hate": {"filtered": False, "severity": "safe"}}


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        message = {"role": "assistant", "content": "Hi there"}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        choice["content_filter_results"] = SAFE
        doc = {**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}
        return web.json_response({**doc, "prompt_filter_results": FILTERS})
    opening = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
    chunks: list[dict[str, Any]] = [{**opening, "prompt_filter_results": FILTERS}]
    deltas = [({"role": "assistant", "content": ""}, None), ({"content": "Hi there"}, None)]
    for delta, finish in [*deltas, ({}, "stop")]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        # as Azure: each content chunk's filter results, the first and last chunk's empty
        choice["content_filter_results"] = SAFE if delta.get("content") else {}
        chunks.append({**HEAD, "object": "chat.completion.chunk", "choices": [choice]})
    chunks.append({**HEAD, "object": "chat.completion.chunk", "choices": [], "usage": USAGE})
    return await openai_sse(request, chunks)


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/openai/deployments/{name}/chat/completions", _chat)) as server:
        yield server


def _azure(url: str) -> openai.AzureOpenAI:
    client = openai.AzureOpenAI(
        azure_endpoint=url,
        api_key="az-key",
        api_version="2024-10-21",
        azure_deployment="gpt-4o",
        max_retries=0,
    )
    return track(client)


def _config(upstream_url: str) -> dict[str, Any]:
    cfg = cache_config(upstream_url, tiers=["memory"], routes=())
    azure = {
        "name": "azure-chat",
        "match": {"prefix": "/openai/deployments/", "methods": ["POST"]},
        "protocol": "openai",
        "backend": "upstream",
        "cache": {"exact": {"enabled": True, "ttl": 60}},
    }
    cfg["routes"].insert(0, azure)
    return cfg


def test_a_stored_azure_stream_is_azures_body(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(_config(upstream.url))
    kw: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    kw["temperature"] = 0
    stream = _azure(gw.url).chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hi there"
    raw = _azure(gw.url).chat.completions.with_raw_response.create(**kw)
    direct = _azure(upstream.url).chat.completions.create(**kw).model_dump()
    served = raw.parse().model_dump()
    assert raw.headers["X-Cache"] == "hit"
    assert (served["id"], served["created"], served["model"]) == (
        "chatcmpl-az1",
        1700000000,
        "gpt-4o-2024-11-20",
    )
    assert served["prompt_filter_results"] == direct["prompt_filter_results"] == FILTERS
    assert served["choices"] == direct["choices"]
    assert served == direct


def test_a_stored_azure_body_streams_its_filter_results(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(_config(upstream.url))
    kw: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    kw["temperature"] = 0
    assert _azure(gw.url).chat.completions.create(**kw).choices[0].message.content == "Hi there"
    raw = _azure(gw.url).chat.completions.with_raw_response.create(**kw, stream=True)
    chunks = [c.model_dump() for c in raw.parse()]
    assert raw.headers["X-Cache"] == "hit"
    assert chunks[-1]["choices"][0]["content_filter_results"] == SAFE
