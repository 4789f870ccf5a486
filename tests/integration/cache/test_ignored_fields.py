"""Fields the key leaves out (they tag the caller, never change the answer) are left out only
when well-formed. OpenAI refuses a `user` that is not a string and the Messages API a
`metadata` other than `{"user_id": string or null}` (400): such a request was keyed as the
well-formed one, so it was the upstream's 400 cold and a 200 hit once that one was stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, running
from tests.support.upstream_anthropic import message_for


def _refused(message: str, anthropic_envelope: bool = False) -> web.Response:
    error = {"type": "invalid_request_error", "message": message}
    body = {"type": "error", "error": error} if anthropic_envelope else {"error": error}
    return web.json_response(body, status=400)


async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    if "user" in body and not isinstance(body["user"], str):
        return _refused("Invalid type for 'user': expected a string.")
    message = {"role": "assistant", "content": "hello"}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    doc = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": usage}
    return web.json_response({**doc, "choices": [choice]})


async def _messages(request: web.Request) -> web.Response:
    body = await request.json()
    metadata = body.get("metadata", {})
    if set(metadata) - {"user_id"} or not isinstance(metadata.get("user_id", ""), str | None):
        return _refused("metadata: Extra inputs are not permitted", anthropic_envelope=True)
    return web.json_response(message_for(body, "up"))


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    def app() -> web.Application:
        a = web.Application()
        a.router.add_post("/v1/chat/completions", _chat)
        a.router.add_post("/v1/messages", _messages)
        return a

    with running(app) as server:
        yield server


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = cache_config(upstream.url, tiers=["memory"], routes=("chat",))
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


def test_a_user_that_is_not_a_string_is_the_upstreams_400_cold_and_warm(gw: ServerThread) -> None:
    c = track(openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0))
    kw: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    kw["temperature"] = 0
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(**kw, user=42)  # type: ignore[arg-type]
    assert c.chat.completions.with_raw_response.create(**kw, user="u1").headers["X-Cache"] == "miss"
    assert c.chat.completions.with_raw_response.create(**kw, user="u2").headers["X-Cache"] == "hit"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(**kw, user=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "metadata",
    [{"user_id": "u", "session": "s"}, {"user_id": 7}, {"tags": ["a"]}],
    ids=["extra-key", "user-id-not-a-string", "unknown-key"],
)
def test_metadata_the_api_refuses_is_its_400_cold_and_warm(
    gw: ServerThread, metadata: dict[str, Any]
) -> None:
    c = track(anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0))
    kw: dict[str, Any] = {"model": "claude-test", "max_tokens": 32}
    kw["messages"] = [{"role": "user", "content": "hello there"}]
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(**kw, metadata=metadata)
    first = c.messages.with_raw_response.create(**kw, metadata={"user_id": "alice"})
    again = c.messages.with_raw_response.create(**kw, metadata={"user_id": None})
    assert (first.headers["X-Cache"], again.headers["X-Cache"]) == ("miss", "hit")
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(**kw, metadata=metadata)
