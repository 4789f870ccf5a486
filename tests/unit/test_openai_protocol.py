"""The OpenAI stream converters on their own (gateway.protocols.openai_sse, stream_codecs): a
stored stream served as one body and back, and when a stored stream is a whole answer. Through
the gateway with the SDK: tests/integration/cache/test_exact_stream.py."""

from __future__ import annotations

import json

from gateway.protocols import openai_sse
from gateway.protocols.openai_sse import body_to_events, events_to_body
from gateway.protocols.stream_codecs import completion_check


def test_a_streamed_tool_call_keeps_a_null_content_when_served_as_one_body() -> None:
    events = [
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function",'
        b'"function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}',
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
        b"data: [DONE]",
    ]
    body = events_to_body(events, "chat")
    assert body is not None
    msg = json.loads(body)["choices"][0]["message"]
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "f"


def test_completions_logprobs_round_trip_between_stream_and_body() -> None:
    lp = {"tokens": ["a", " b"], "token_logprobs": [-0.1, -0.2], "text_offset": [0, 1]}
    body = json.dumps(
        {
            "id": "x",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "a b", "logprobs": lp, "finish_reason": "stop"}],
        }
    ).encode()
    events = body_to_events(body, "completions")
    assert events is not None
    back = events_to_body(events, "completions")
    assert back is not None and json.loads(back)["choices"][0]["logprobs"] == lp
    # and a stream that carried them chunk by chunk joins them in order
    chunks = [
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-0.1],"text_offset":[0]},'
        b'"finish_reason":null}]}',
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" b","logprobs":{"tokens":[" b"],"token_logprobs":[-0.2],"text_offset":[1]},'
        b'"finish_reason":"stop"}]}',
        b"data: [DONE]",
    ]
    joined = events_to_body(chunks, "completions")
    assert joined is not None and json.loads(joined)["choices"][0]["logprobs"] == lp


def test_a_stream_is_complete_only_with_every_choice_finished() -> None:
    def chunk(i: int, finish: str | None) -> bytes:
        doc = {"choices": [{"index": i, "delta": {"content": "x"}, "finish_reason": finish}]}
        return b"data: " + json.dumps(doc).encode()

    done = openai_sse.DONE
    assert openai_sse.completed([chunk(0, None), chunk(0, "stop"), done])
    # an "error": null beside the fields is no error (Foundry Local sends one on every chunk)
    with_null = (
        b"data: "
        + json.dumps(
            {"error": None, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        ).encode()
    )
    assert openai_sse.completed([with_null, done])
    # chunks not in the API's shape: not a whole answer, and no exception
    for odd in ({"choices": 5}, {"choices": [{"index": [0], "finish_reason": "stop"}]}):
        assert not openai_sse.completed([b"data: " + json.dumps(odd).encode(), done])
    # no choice at all is no answer; "data:[DONE]" (no space) is [DONE] too
    assert not openai_sse.completed([done])
    assert openai_sse.completed([chunk(0, "stop"), b"data:[DONE]"])
    assert not openai_sse.completed([chunk(0, None), done])  # cut short, then [DONE]
    # n=2: the second choice never finished
    assert not openai_sse.completed([chunk(0, "stop"), chunk(1, None), done])
    assert openai_sse.completed([chunk(0, "stop"), chunk(1, "length"), done])
    assert not openai_sse.completed([chunk(0, "stop")])  # no [DONE]


def test_answers_out_of_the_apis_shape_are_not_converted_nor_raise() -> None:
    """An entry the converter cannot carry over whole answers only its own framing (the other
    one misses) rather than a 500 for every client of that framing until its TTL."""

    def ev(delta: object) -> bytes:
        doc = {"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return b"data: " + json.dumps(doc).encode()

    done = openai_sse.DONE
    for odd in ("hi", {"tool_calls": [{"index": "0"}]}):
        assert events_to_body([ev(odd), done], "chat") is None, odd
    # an object where text belongs is carried over as it came (it used to raise)
    kept = events_to_body([ev({"content": {"x": "1"}}), done], "chat")
    assert kept is not None and json.loads(kept)["choices"][0]["message"]["content"] == {"x": "1"}
    # streamed audio comes in base64 pieces that do not join as text: not converted
    pieces = [ev({"audio": {"id": "a", "data": "AQIDBA=="}}), ev({"audio": {"data": "BQYHCA=="}})]
    assert events_to_body([*pieces, done], "chat") is None
    # one whole object in one chunk is kept
    whole = events_to_body([ev({"audio": {"id": "a", "data": "AQIDBA=="}}), done], "chat")
    assert whole is not None and json.loads(whole)["choices"][0]["message"]["audio"]["id"] == "a"
    for body in ({"choices": [5]}, {"choices": [{"message": "hi"}]}):
        assert body_to_events(json.dumps(body).encode(), "chat") is None, body


def test_a_passthrough_routes_sse_is_whole_when_it_ends_in_done() -> None:
    done = openai_sse.DONE
    # a passthrough route's SSE is not parsed: ending in [DONE] is the whole rule
    raw = completion_check("raw").completed
    assert raw([b"data: token one", b"data: token two", done])
    assert not raw([b"data: token one"])
