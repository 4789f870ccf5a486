"""A stand-in chat model that answers each question by its class.

Questions mapped to one class get one answer; any other text gets its own. The semantic
error-budget tests and `bench.semantic_budget` use it: a semantic hit is right exactly when it
returns the asker's class answer. The map can change while it runs (a test can make the
upstream's answer move, as a real model's might). Calls are counted per model. It speaks
OpenAI chat and Anthropic Messages; with `tools` it answers with a tool call whose arguments
carry the class answer (one class, one call; another class, other arguments).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from aiohttp import web

ANSWERS: web.AppKey[dict[str, str]] = web.AppKey("answers", dict)
CALLS: web.AppKey[Counter[str]] = web.AppKey("calls", Counter)
TOOLS: web.AppKey[bool] = web.AppKey("tools", bool)


def class_answer(cls: str) -> str:
    return "answer-" + hashlib.blake2b(cls.encode(), digest_size=8).hexdigest()


def _answer(request: web.Request, body: dict[str, Any]) -> tuple[str, str]:
    """(model, class answer) of the last user turn (a string or text blocks)."""
    last = body["messages"][-1]["content"]
    if isinstance(last, list):
        last = "".join(b.get("text", "") for b in last if isinstance(b, dict))
    model = body.get("model", "m")
    request.app[CALLS][model] += 1
    return model, request.app[ANSWERS].get(last) or class_answer("text:" + last)


async def _chat(request: web.Request) -> web.Response:
    model, content = _answer(request, await request.json())
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if request.app[TOOLS]:
        call = {"name": "answer", "arguments": json.dumps({"text": content})}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        }
    choice = {"index": 0, "message": message}
    return web.json_response(
        {"id": "x", "object": "chat.completion", "model": model, "choices": [choice]}
    )


async def _messages(request: web.Request) -> web.Response:
    model, content = _answer(request, await request.json())
    block: dict[str, Any] = {"type": "text", "text": content}
    if request.app[TOOLS]:
        block = {"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"text": content}}
    return web.json_response(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": "tool_use" if request.app[TOOLS] else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 5},
        }
    )


def build_class_upstream(answers: dict[str, str], tools: bool = False) -> web.Application:
    """answers: question text → answer text (the same dict object: changes apply live)."""
    app = web.Application()
    app[ANSWERS] = answers
    app[CALLS] = Counter()
    app[TOOLS] = tools
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/messages", _messages)
    return app
