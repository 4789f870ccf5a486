"""Answer text out of stored entries, and answer agreement."""

from __future__ import annotations

import json

import numpy as np

from cache.codec import CacheEntry
from cache.semantic.answers import EmbeddingMatch, ExactMatch, answer_text


def chat(content: str) -> CacheEntry:
    body = {
        "id": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }
    return CacheEntry(200, [], body=json.dumps(body).encode(), kind="chat")


def sse(*pieces: str) -> CacheEntry:
    docs = [
        {"id": str(i), "choices": [{"index": 0, "delta": {"content": p}}]}
        for i, p in enumerate(pieces)
    ]
    events = [f"data: {json.dumps(d)}".encode() for d in docs]
    return CacheEntry(200, [], events=[*events, b"data: [DONE]"], kind="chat")


def test_text_from_a_json_body_and_from_sse_events_is_the_same() -> None:
    assert answer_text(chat("Paris is the capital.")) == "Paris is the capital."
    assert answer_text(sse("Paris", " is the", " capital.")) == "Paris is the capital."
    comp = CacheEntry(
        200, [], body=b'{"choices": [{"index": 0, "text": "42"}]}', kind="completions"
    )
    assert answer_text(comp) == "42"


def test_errors_and_other_shapes_give_no_text() -> None:
    assert answer_text(CacheEntry(500, [], body=b'{"error": "x"}')) is None
    assert answer_text(CacheEntry(200, [], body=b"not json")) is None
    assert answer_text(CacheEntry(200, [], body=b'{"data": []}')) is None


async def test_exact_match_ignores_whitespace_only() -> None:
    m = ExactMatch()
    assert await m.agree("q", "Paris  is\nthe capital. ", "Paris is the capital.")
    assert not await m.agree("q", "Paris", "Lyon")


async def test_embedding_match_uses_the_answer_cosine() -> None:
    vecs = {"a": np.asarray([1.0, 0.0]), "b": np.asarray([0.96, 0.28]), "c": np.asarray([0.0, 1.0])}

    async def embed(t: str) -> np.ndarray:
        return vecs[t]

    m = EmbeddingMatch(embed, 0.95)
    assert await m.agree("q", "a", "b")
    assert not await m.agree("q", "a", "c")


async def test_judge_asks_a_chat_endpoint_and_reads_yes_or_no() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from cache.semantic.answers import JudgeMatch

    asked: list[str] = []

    async def judge(request: web.Request) -> web.Response:
        doc = await request.json()
        prompt = doc["messages"][0]["content"]
        asked.append(prompt)
        verdict = "Yes." if "Paris" in prompt and "capital of France" in prompt else "no"
        if "broken" in prompt:
            return web.json_response({"error": "x"}, status=500)
        return web.json_response({"choices": [{"index": 0, "message": {"content": verdict}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge)
    async with TestServer(app, host="127.0.0.1") as server:
        m = JudgeMatch(str(server.make_url("/v1/chat/completions")), "judge-model")
        assert await m.agree("capital of France?", "Paris.", "It is Paris") is True
        assert await m.agree("capital of Spain?", "Madrid", "Seville") is False
        assert await m.agree("broken?", "a", "b") is None  # no verdict: no label
        assert await m.agree("same?", "x", " x ") is True  # equal answers need no judge
    assert len(asked) == 3
