"""Answer text out of stored entries, and answer agreement."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cache.codec import CacheEntry
from cache.semantic.answer_text import answer_text
from cache.semantic.answers import EmbeddingMatch, ExactMatch


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

    from cache.semantic.judge import JudgeFailed, JudgeMatch, url_judge

    asked: list[dict[str, object]] = []

    async def judge(request: web.Request) -> web.Response:
        doc = await request.json()
        prompt = doc["messages"][0]["content"]
        asked.append(doc)
        verdict = "Yes." if "Paris" in prompt and "capital of France" in prompt else "no"
        if "broken" in prompt:
            return web.json_response({"error": "x"}, status=500)
        return web.json_response({"choices": [{"index": 0, "message": {"content": verdict}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge)
    async with TestServer(app, host="127.0.0.1") as server:
        post, close = url_judge(str(server.make_url("/v1/chat/completions")), {}, 5.0)
        # a null removes a default: models that take max_completion_tokens, not max_tokens
        m = JudgeMatch(post, "judge-model", {"max_tokens": None, "max_completion_tokens": 3})
        assert await m.agree("capital of France?", "Paris.", "It is Paris") is True
        assert await m.agree("capital of Spain?", "Madrid", "Seville") is False
        with pytest.raises(JudgeFailed, match="answered 500"):  # no verdict: no label
            await m.agree("broken?", "a", "b")
        assert await m.agree("same?", "x", " x ") is True  # equal answers need no judge
        await close()
    assert len(asked) == 3
    assert "max_tokens" not in asked[0] and asked[0]["max_completion_tokens"] == 3
    assert asked[0]["model"] == "judge-model" and asked[0]["temperature"] == 0


def test_a_verdict_is_the_first_word_exactly() -> None:
    from cache.semantic.judge import verdict

    assert verdict("Yes.") is True and verdict("**no**, they differ") is False
    assert verdict("YES") is True and verdict(" no") is False
    # a reply that only starts like a verdict is none
    for unclear in ("not sure", "none of them", "yesterday", "", "Maybe"):
        assert verdict(unclear) is None, unclear


def tool_chat(arguments: str, content: str | None = None) -> CacheEntry:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    msg = {"role": "assistant", "content": content, "tool_calls": [call]}
    body = {"id": "x", "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}]}
    return CacheEntry(200, [], body=json.dumps(body).encode(), kind="chat")


def tool_sse(*arg_pieces: str) -> CacheEntry:
    first = {"index": 0, "id": "c1", "type": "function", "function": {"name": "look"}}
    deltas = [{"tool_calls": [first]}, {"tool_calls": [{"index": 0, "function": {"name": "up"}}]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in arg_pieces]
    docs = [{"id": "x", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    return CacheEntry(
        200, [], events=[f"data: {json.dumps(d)}".encode() for d in docs], kind="chat"
    )


def test_a_tool_call_answer_is_its_name_and_arguments() -> None:
    # Two answers calling one tool with other arguments are not one answer (they were both "").
    paris, lyon = (
        answer_text(tool_chat('{"city": "Paris"}')),
        answer_text(tool_chat('{"city":"Lyon"}')),
    )
    assert paris == '[tool call] lookup({"city":"Paris"})' and paris != lyon
    # key order and spacing of the arguments do not matter; a stream says the same as a body
    same = tool_chat('{ "units": "metric",\n "city": "Paris" }')
    assert answer_text(same) == answer_text(tool_chat('{"city": "Paris", "units": "metric"}'))
    assert answer_text(tool_sse('{"city"', ': "Paris"}')) == paris
    # text beside a tool call counts too
    assert answer_text(tool_chat("{}", "Let me look.")) == "Let me look.\n[tool call] lookup({})"
    legacy = {"choices": [{"index": 0, "message": {"content": None, "function_call": {
        "name": "lookup", "arguments": '{"city": "Paris"}'}}}]}  # fmt: skip
    assert answer_text(CacheEntry(200, [], body=json.dumps(legacy).encode())) == paris


def anthropic_message(*blocks: dict[str, object]) -> CacheEntry:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "content": list(blocks)}
    return CacheEntry(200, [], body=json.dumps(body).encode(), kind="messages")


def anthropic_sse(text: str, tool_json: list[str]) -> CacheEntry:
    docs: list[dict[str, object]] = [
        {"type": "message_start", "message": {"id": "msg_1", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta",
                                                              "thinking": "hmm"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "t1", "name": "lookup", "input": {}}},
    ]  # fmt: skip
    docs += [
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta",
                                                              "partial_json": p}}
        for p in tool_json
    ]  # fmt: skip
    docs += [{"type": "message_stop"}]
    events = [f"event: {d['type']}\ndata: {json.dumps(d)}".encode() for d in docs]
    return CacheEntry(200, [], events=events, kind="messages")


def test_anthropic_messages_have_answer_text_as_a_body_and_as_a_stream() -> None:
    body = anthropic_message(
        {"type": "thinking", "thinking": "the user wants the weather", "signature": "s"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"city": "Paris"}},
    )
    want = 'Checking.\n[tool call] lookup({"city":"Paris"})'
    assert answer_text(body) == want
    assert answer_text(anthropic_sse("Checking.", ['{"city": ', '"Paris"}'])) == want
    assert answer_text(anthropic_message({"type": "text", "text": "Paris."})) == "Paris."
    other = anthropic_message({"type": "tool_use", "id": "t", "name": "lookup", "input": {}})
    assert answer_text(other) == "[tool call] lookup({})" != answer_text(body)
    # a tool with no input streams "" where its JSON form has {}: one answer either way
    assert answer_text(anthropic_sse("", [""])) == "[tool call] lookup({})"
    assert answer_text(tool_sse()) == answer_text(tool_chat("")) == "[tool call] lookup({})"


def test_refusals_and_audio_transcripts_are_answers_too() -> None:
    def message(**fields: object) -> CacheEntry:
        body = {"choices": [{"index": 0, "message": {"role": "assistant", **fields}}]}
        return CacheEntry(200, [], body=json.dumps(body).encode(), kind="chat")

    refused = message(content=None, refusal="I can't help with that.")
    assert answer_text(refused) == "[refusal] I can't help with that."
    assert answer_text(refused) != answer_text(message(content=None, refusal="No."))
    assert answer_text(refused) != answer_text(message(content=""))  # not an empty answer
    spoken = message(content=None, audio={"id": "a1", "data": "UklGR...", "transcript": "Paris."})
    assert answer_text(spoken) == "Paris."
    docs = [
        {"choices": [{"index": 0, "delta": {"refusal": "I can't "}}]},
        {"choices": [{"index": 0, "delta": {"refusal": "help with that."}}]},
    ]
    streamed = CacheEntry(200, [], events=[f"data: {json.dumps(d)}".encode() for d in docs])
    assert answer_text(streamed) == answer_text(refused)
