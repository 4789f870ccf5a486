"""A call whose answer quotes its prompt is never answered from a paraphrase's entry.

With `echo` a completion starts with the prompt itself (OpenAI's completions, vLLM's chat);
vLLM's `prompt_logprobs` and `return_token_ids` list the prompt's tokens, and its chat's
`continue_final_message` / `add_generation_prompt: false` continue the last turn's text. A
paraphrase's stored answer to any of these holds the other question: before, the second
question below was a semantic hit whose text began "How do I reset ...".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

ASKED = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"
ANSWER = " Open Settings, then Security."


def _prompt_of(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return str(body["prompt"])
    return str(body["messages"][-1]["content"])


def _answer(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The completion text and the prompt-describing fields, as OpenAI and vLLM write them."""
    prompt = _prompt_of(body)
    quoted = (
        body.get("echo")
        or body.get("continue_final_message")
        or body.get("add_generation_prompt") is False
    )
    extra: dict[str, Any] = {}
    if body.get("prompt_logprobs") is not None:
        extra["prompt_logprobs"] = [{w: {"logprob": -1.0}} for w in prompt.split()]
    if body.get("return_token_ids"):
        extra["prompt_token_ids"] = [sum(map(ord, w)) for w in prompt.split()]
    return (prompt + ANSWER if quoted else ANSWER.strip()), extra


async def completions(request: web.Request) -> web.Response:
    body = await request.json()
    text, extra = _answer(body)
    choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
    return web.json_response(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [{**choice, **extra}],
        }
    )


async def chat(request: web.Request) -> web.Response:
    body = await request.json()
    text, extra = _answer(body)
    message = {"role": "assistant", "content": text}
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
            **extra,
        }
    )


@pytest.fixture
def gw(start_gateway: Callable[..., ServerThread]) -> Iterator[ServerThread]:
    def app() -> web.Application:
        a = web.Application()
        a.router.add_post("/v1/completions", completions)
        a.router.add_post("/v1/chat/completions", chat)
        return a

    upstream = ServerThread(app).start()
    cfg = cache_config(upstream.url, routes=("chat", "completions"))
    for r in cfg["routes"]:
        if r["name"] in ("chat", "completions"):
            r["cache"]["semantic"] = {"enabled": True}
    yield start_gateway(cfg)
    upstream.stop()


def complete(c: openai.OpenAI, prompt: str, extra: dict[str, Any]) -> tuple[Any, str]:
    raw = c.completions.with_raw_response.create(
        model="m", prompt=prompt, temperature=0, extra_body=extra
    )
    return raw.parse().model_dump(), raw.headers["x-cache"]


def chat_call(c: openai.OpenAI, prompt: str, extra: dict[str, Any]) -> tuple[Any, str]:
    raw = c.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        extra_body=extra,
    )
    return raw.parse().model_dump(), raw.headers["x-cache"]


QUOTING = [
    ("completions", complete, {"echo": True}),
    ("completions", complete, {"prompt_logprobs": 0}),
    ("completions", complete, {"return_token_ids": True}),
    ("chat", chat_call, {"echo": True, "add_generation_prompt": False}),
    ("chat", chat_call, {"continue_final_message": True, "add_generation_prompt": False}),
    ("chat", chat_call, {"prompt_logprobs": 1}),
    ("chat", chat_call, {"return_token_ids": True}),
]


@pytest.mark.parametrize(
    ("route", "call", "extra"), QUOTING, ids=[q[0] + ":" + "+".join(q[2]) for q in QUOTING]
)
def test_an_answer_that_quotes_its_prompt_is_not_served_to_a_paraphrase(
    gw: ServerThread, route: str, call: Callable[..., tuple[Any, str]], extra: dict[str, Any]
) -> None:
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-a", max_retries=0)
    try:
        first, x1 = call(c, ASKED, extra)
        again, x2 = call(c, PARAPHRASE, extra)
        # the paraphrase's own answer, which the stored one is not: it quotes the other prompt
        assert (x1, x2) == ("miss", "miss") and again != first
        # its exact repeat is still a hit; without the quoting field the paraphrase is served
        assert call(c, ASKED, extra) == (first, "hit")
        call(c, ASKED, {})
        assert call(c, PARAPHRASE, {})[1] == "semantic-hit", route
    finally:
        c.close()
