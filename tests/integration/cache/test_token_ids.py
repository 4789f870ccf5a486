"""vLLM's token ids (`return_token_ids`) survive a hit in the other framing.

vLLM answers `return_token_ids: true` with the prompt's ids (`prompt_token_ids`, on the body
and on the stream's first chunk) and each choice's output ids (`token_ids`: the whole list on
the body's choice, each chunk's own ids on its stream). RL and evaluation harnesses read them to
score exactly the tokens that were sampled. A stored stream served as one body kept only the
last chunk's ids and no prompt ids; a stored body served as a stream had no prompt ids.
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

HEAD = {"id": "chatcmpl-v1", "created": 1700000000, "model": "qwen"}
PROMPT_IDS = [151644, 872, 198, 13048]
# (text, that step's ids): the last step is the end-of-sequence token, with no text
STEPS = [("Hello", [9707]), (" there", [1052]), ("", [151645])]
USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body.get("return_token_ids") is True
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(t for t, _ in STEPS)}
        ids = [i for _, step in STEPS for i in step]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        choice.update(stop_reason=None, token_ids=ids)
        doc = {**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}
        return web.json_response({**doc, "prompt_token_ids": PROMPT_IDS})
    opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    chunks: list[dict[str, Any]] = [{"choices": [opening], "prompt_token_ids": PROMPT_IDS}]
    for n, (text, ids) in enumerate(STEPS):
        last = n == len(STEPS) - 1
        choice = {"index": 0, "delta": {"content": text} if text else {}, "token_ids": ids}
        choice["finish_reason"] = "stop" if last else None
        if last:
            choice["stop_reason"] = None
        chunks.append({"choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({"choices": [], "usage": USAGE})
    return await openai_sse(
        request, ({**HEAD, "object": "chat.completion.chunk", **c} for c in chunks)
    )


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _chat)) as server:
        yield server


KW: dict[str, Any] = {
    "model": "qwen",
    "temperature": 0,
    "messages": [{"role": "user", "content": "Hi"}],
    "extra_body": {"return_token_ids": True},
}


def _streamed(url: str) -> tuple[list[int] | None, list[int], str]:
    """The prompt ids of the stream's first chunk, the output ids of all its chunks, X-Cache."""
    raw = openai_client(url).chat.completions.with_raw_response.create(
        **KW, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c.model_dump() for c in raw.parse()]
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    return chunks[0].get("prompt_token_ids"), ids, raw.headers.get("X-Cache", "")


def test_a_stored_stream_served_as_one_body_has_every_token_id(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    assert _streamed(gw.url)[2] == "miss"
    raw = openai_client(gw.url).chat.completions.with_raw_response.create(**KW)
    assert raw.headers["X-Cache"] == "hit"
    served = raw.parse().model_dump()
    direct = openai_client(upstream.url).chat.completions.create(**KW).model_dump()
    assert served["choices"][0]["token_ids"] == [9707, 1052, 151645]
    assert served["prompt_token_ids"] == PROMPT_IDS
    assert served == direct


def test_a_stored_body_served_as_a_stream_has_the_prompts_ids(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    assert (
        openai_client(gw.url).chat.completions.with_raw_response.create(**KW).headers["X-Cache"]
        == "miss"
    )
    prompt, ids, x_cache = _streamed(gw.url)
    assert x_cache == "hit"
    assert (prompt, ids) == _streamed(upstream.url)[:2] == (PROMPT_IDS, [9707, 1052, 151645])
