"""A stand-in chat model that answers each question by its class.

Questions mapped to one class get one answer; any other text gets its own. The semantic
error-budget tests and `bench.semantic_budget` use it: a semantic hit is right exactly when it
returns the asker's class answer. The map can change while it runs (a test can make the
upstream's answer move, as a real model's might). Calls are counted per model.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from aiohttp import web

ANSWERS: web.AppKey[dict[str, str]] = web.AppKey("answers", dict)
CALLS: web.AppKey[Counter[str]] = web.AppKey("calls", Counter)


def class_answer(cls: str) -> str:
    return "answer-" + hashlib.blake2b(cls.encode(), digest_size=8).hexdigest()


async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    text = body["messages"][-1]["content"]
    model = body.get("model", "m")
    request.app[CALLS][model] += 1
    content = request.app[ANSWERS].get(text) or class_answer("text:" + text)
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    return web.json_response(
        {"id": "x", "object": "chat.completion", "model": model, "choices": [choice]}
    )


def build_class_upstream(answers: dict[str, str]) -> web.Application:
    """answers: question text → answer text (the same dict object: changes apply live)."""
    app = web.Application()
    app[ANSWERS] = answers
    app[CALLS] = Counter()
    app.router.add_post("/v1/chat/completions", _chat)
    return app
