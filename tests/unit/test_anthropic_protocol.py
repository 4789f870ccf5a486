"""The anthropic adapter's key and namespace, and its SSE ⇄ JSON conversion, on their own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cache.keys import KeyBuilder
from cache.semantic.namespace import namespace_of
from cache.tenant import TenantHasher
from gateway.errors import BadRequest, error_body
from gateway.protocols import anthropic_sse
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import Call
from tests.support.upstream_anthropic import message_for, stream_events

BASE: dict[str, Any] = {
    "model": "claude-x",
    "max_tokens": 64,
    "system": "Be brief.",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "How do I reset my password?"},
    ],
}
V1 = {"anthropic-version": "2023-06-01"}


def parse(body: dict[str, Any], headers: dict[str, str] | None = None) -> Call:
    call = AnthropicAdapter().parse(
        "POST", "/v1/messages", "", "application/json", json.dumps(body).encode(), headers or V1
    )
    assert call is not None
    return call


def key(body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    call = parse(body, headers)
    return (
        KeyBuilder("messages", [], TenantHasher(b"test"))
        .build(call.model, call.key_fields, None)
        .value
    )


def ns(body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    call = parse(body, headers)
    return namespace_of("messages", call.model, call.context, "t")


@pytest.mark.parametrize(
    "change",
    [
        {"model": "claude-y"},
        {"system": "Be verbose."},
        {"max_tokens": 65},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"top_k": 5},
        {"stop_sequences": ["\n"]},
        {"tools": [{"name": "t", "input_schema": {"type": "object"}}]},
        {"tool_choice": {"type": "any"}},
        {"messages": [*BASE["messages"][:-1], {"role": "user", "content": "other"}]},
    ],
)
def test_every_answer_changing_field_changes_the_key(change: dict[str, Any]) -> None:
    assert key({**BASE, **change}) != key(BASE)


def test_framing_and_bookkeeping_do_not_change_the_key() -> None:
    same = {**BASE, "stream": True, "metadata": {"user_id": "u1"}}
    assert key(same) == key(BASE)
    reordered = dict(reversed(list(BASE.items())))
    assert key(reordered) == key(BASE)


def test_string_content_equals_its_text_block() -> None:
    blocks = {
        **BASE,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
            for m in BASE["messages"]
        ],
    }
    assert key(blocks) == key(BASE)


def test_version_and_beta_headers_are_in_the_key() -> None:
    assert key(BASE, {"anthropic-version": "2024-01-01"}) != key(BASE)
    beta = {**V1, "anthropic-beta": "a-2025, b-2025"}
    assert key(BASE, beta) != key(BASE)
    # a beta set: order, spaces and repeats do not matter
    assert key(BASE, {**V1, "anthropic-beta": "b-2025,a-2025,a-2025"}) == key(BASE, beta)


def test_namespace_is_everything_but_the_last_user_turn() -> None:
    other_q = {**BASE, "messages": [*BASE["messages"][:-1], {"role": "user", "content": "Q?"}]}
    assert ns(other_q) == ns(BASE)
    assert parse(BASE).semantic_text == "How do I reset my password?"
    assert ns({**BASE, "system": "Be verbose."}) != ns(BASE)
    assert ns({**BASE, "messages": BASE["messages"][1:]}) != ns(BASE)
    assert ns(BASE, {"anthropic-version": "2024-01-01"}) != ns(BASE)
    assert ns({**BASE, "temperature": 0}) != ns(BASE)


def test_semantic_text_only_for_a_final_user_text_turn() -> None:
    tool_result = {"type": "tool_result", "tool_use_id": "t1", "content": "42"}
    assert (
        parse({**BASE, "messages": [{"role": "user", "content": [tool_result]}]}).semantic_text
        is None
    )
    last_assistant = {**BASE, "messages": BASE["messages"][:2]}
    assert parse(last_assistant).semantic_text is None
    assert not parse(BASE).deterministic
    assert parse({**BASE, "temperature": 0}).deterministic


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}, "messages[0]"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "stream": "yes",
            },
            "stream",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "system": 3,
            },
            "system",
        ),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse(body)
    assert info.value.param == param
    doc = json.loads(error_body("anthropic", info.value))
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"


def test_other_paths_are_not_parsed() -> None:
    adapter = AnthropicAdapter()
    assert adapter.parse("POST", "/v1/messages/count_tokens", "", "", b"{}") is None
    assert adapter.parse("GET", "/v1/messages", "", "", b"") is None


@pytest.mark.parametrize(
    "body",
    [
        {**BASE},
        {**BASE, "max_tokens": 2},
        {**BASE, "tools": [{"name": "lookup"}], "tool_choice": {"type": "tool", "name": "lookup"}},
    ],
)
def test_stream_and_message_convert_both_ways(body: dict[str, Any]) -> None:
    msg = message_for(body, "up")
    # what the API streams → the message a plain client gets
    events = anthropic_sse.split_events(b"".join(stream_events(msg)))
    assert anthropic_sse.completed(events)
    built = anthropic_sse.events_to_body(events)
    assert built is not None and json.loads(built) == msg
    # a stored message → a stream → the same message again
    replay = anthropic_sse.body_to_events(json.dumps(msg).encode())
    assert replay is not None and anthropic_sse.completed(replay)
    again = anthropic_sse.events_to_body(replay)
    assert again is not None and json.loads(again) == msg


def test_a_stream_without_message_stop_is_incomplete() -> None:
    events = anthropic_sse.split_events(b"".join(stream_events(message_for(BASE, "up"))))
    assert not anthropic_sse.completed(events[:-1])
    assert not anthropic_sse.completed([])
    error = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}'
    assert not anthropic_sse.completed([*events[:-1], error])


def test_unconvertible_bodies_are_refused() -> None:
    assert anthropic_sse.body_to_events(b"not json") is None
    assert anthropic_sse.body_to_events(b'{"type": "error"}') is None
    assert anthropic_sse.events_to_body([b"data: {broken"]) is None
    start = b'data: {"type": "message_start", "message": {"type": "message", "content": []}}'
    odd = b'data: {"type": "content_block_delta", "index": "0", "delta": {"type": "text_delta"}}'
    assert anthropic_sse.events_to_body([start, odd]) is None
    # a content block given as text: not a message the SDK could read
    assert anthropic_sse.body_to_events(b'{"type": "message", "content": ["x"]}') is None


def test_a_stream_with_a_delta_of_unknown_type_is_not_converted() -> None:
    """Its block would be built without what the delta said: the stored stream then answers
    streaming clients only, and a plain client's miss stores the message."""
    events = anthropic_sse.split_events(b"".join(stream_events(message_for(BASE, "up"))))
    odd = b'data: {"type": "content_block_delta", "index": 0, "delta": {"type": "novel_delta"}}'
    at = next(i for i, e in enumerate(events) if b"content_block_stop" in e)
    assert anthropic_sse.events_to_body(events) is not None
    assert anthropic_sse.events_to_body([*events[:at], odd, *events[at:]]) is None
