"""vLLM's `stream_options.continuous_usage_stats` gets usage on every chunk only when asked.

vLLM answers a streamed call asking `{"include_usage": true, "continuous_usage_stats": true}`
with the usage so far on every chunk (progress meters and token budgets read it as it comes)
and the whole call's usage on the last. `stream_options` was framing only: a client that asked
for the final usage chunk alone was served a stored stream with usage on every chunk (a reader
that adds each chunk's usage up, as LangChain's does, counted it many times over), and one that
asked for usage on every chunk was served a stored body converted to a stream with none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running

HEAD = {"id": "chatcmpl-u1", "created": 1700000000, "model": "qwen"}
STEPS = ["Hello", " there"]
PROMPT = 4


def _usage(done: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT, "completion_tokens": done, "total_tokens": PROMPT + done}


async def _chat(request: web.Request) -> web.StreamResponse:
    """As vLLM answers: usage on every chunk only with include_usage and continuous_usage_stats
    (`should_include_usage` in vLLM's serving code)."""
    body = await request.json()
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(STEPS)}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        doc = {**HEAD, "object": "chat.completion", "choices": [choice]}
        return web.json_response({**doc, "usage": _usage(len(STEPS))})
    options = body.get("stream_options") or {}
    include = bool(options.get("include_usage"))
    continuous = include and bool(options.get("continuous_usage_stats"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    deltas = [{"role": "assistant", "content": ""}] + [{"content": t} for t in STEPS] + [{}]
    chunks: list[dict[str, Any]] = []
    for n, delta in enumerate(deltas):
        last = n == len(deltas) - 1
        choice = {"index": 0, "delta": delta, "finish_reason": "stop" if last else None}
        chunk: dict[str, Any] = {"choices": [choice]}
        if continuous:
            chunk["usage"] = _usage(min(n, len(STEPS)))
        chunks.append(chunk)
    if include:
        chunks.append({"choices": [], "usage": _usage(len(STEPS))})
    for chunk in chunks:
        doc = {**HEAD, "object": "chat.completion.chunk", **chunk}
        await resp.write(f"data: {json.dumps(doc)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _chat)) as server:
        yield server


KW: dict[str, Any] = {
    "model": "qwen",
    "temperature": 0,
    "messages": [{"role": "user", "content": "Hi"}],
}
FINAL = {"include_usage": True}
EVERY = {"include_usage": True, "continuous_usage_stats": True}


def _streamed(url: str, options: dict[str, Any]) -> tuple[list[Any], Any, str]:
    """The usage of each chunk with choices, the final usage chunk's, and X-Cache."""
    raw = openai_client(url).chat.completions.with_raw_response.create(
        **KW, stream=True, stream_options=options
    )
    chunks = [c.model_dump() for c in raw.parse()]
    per_chunk = [c["usage"] for c in chunks if c["choices"]]
    final = [c["usage"] for c in chunks if not c["choices"]]
    return per_chunk, final, raw.headers.get("X-Cache", "")


def test_a_client_that_asked_for_the_final_usage_only_gets_no_usage_on_chunks(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    assert _streamed(gw.url, EVERY)[2] == "miss"
    per_chunk, final, _ = _streamed(gw.url, FINAL)
    assert per_chunk == [None] * 4  # (it was each chunk's usage so far)
    assert (per_chunk, final) == _streamed(upstream.url, FINAL)[:2]
    assert _streamed(gw.url, FINAL)[2] == "hit"  # (its own answer is stored)


def test_a_client_that_asked_for_usage_on_every_chunk_gets_it(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    plain = openai_client(gw.url).chat.completions.with_raw_response.create(**KW)
    assert plain.headers["X-Cache"] == "miss"
    assert _streamed(gw.url, FINAL)[2] == "hit"  # (a stored body serves the final usage chunk)
    direct = _streamed(upstream.url, EVERY)[:2]
    assert direct[0][-1]["completion_tokens"] == len(STEPS)
    for x_cache in ("miss", "hit"):  # (it was a hit on the stored body, no usage on chunks)
        per_chunk, final, got = _streamed(gw.url, EVERY)
        assert got == x_cache
        assert (per_chunk, final) == direct
