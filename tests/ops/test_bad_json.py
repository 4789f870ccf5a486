"""JSON the key builder and the upstream could read apart is refused before either reads it.

Python's json.loads keeps the last of two equal keys, and the cache key was built from that,
while the upstream got the bytes as sent: one that keeps the first (rapidjson, simdjson, ...)
answered another question than the key named, and that answer was served from the cache to
clients who asked the other. NaN and Infinity are not JSON at all (RFC 8259); `Infinity` read
as inf was keyed like `1e999`. The upstream here keeps the first value, as such servers do;
the clean client is the real openai SDK (which refuses to send either kind of body itself).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgpack
import openai
import pytest
from aiohttp import web

from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.ops.conftest import http
from tests.ops.test_bad_input import assert_json_error, send
from tests.support.servers import ServerThread, one_route, running


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for k, v in pairs:
        doc.setdefault(k, v)
    return doc


async def _chat(request: web.Request) -> web.Response:
    """An OpenAI chat answer echoing the last turn, read as a first-wins parser reads it."""
    doc = json.loads(await request.read(), object_pairs_hook=_first_wins)
    text = f"echo: {doc['messages'][-1]['content']}"
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": doc["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
    )


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _chat)) as up:
        cfg = cache_config(up.url, tiers=["memory"])
        cfg["routes"].insert(0, anthropic_route())
        settings = Settings.model_validate(cfg)
        server = ServerThread(lambda: build_app(settings), runner_kwargs=SERVER_OPTIONS).start()
        yield server
        server.stop()


def _ask(gw: ServerThread, text: str) -> str | None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-one-tenant", max_retries=0)
    done = client.chat.completions.create(
        model="m", temperature=0, messages=[{"role": "user", "content": text}]
    )
    return done.choices[0].message.content


def test_a_duplicate_key_is_a_400_and_never_keys_another_clients_answer(gw: ServerThread) -> None:
    turn = '[{"role":"user","content":"%s"}]'
    twice = b'{"model":"m","temperature":0,"messages":%s,"messages":%s}' % (
        (turn % "transfer 100 to Alice").encode(),
        (turn % "what is the balance").encode(),
    )
    auth = b"Authorization: Bearer sk-one-tenant\r\n"
    status, _, doc = send(gw, b"/v1/chat/completions", auth, twice)
    # before: 200, the upstream answered the first turn, stored under the key of the second
    assert_json_error(status, doc, 400)
    assert "'messages' twice" in doc["error"]["message"]
    # so a client asking the second question gets its own answer, not the first one's
    assert _ask(gw, "what is the balance") == "echo: what is the balance"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","temperature":0,"model":"m2","messages":[{"role":"user","content":"x"}]}',
        b'{"model":"m","temperature":0,"messages":[{"role":"user","content":"x","role":"user"}]}',
        b'{"model":"m","temperature":0,"messages":[{"role":"user","content":"x"}],'
        b'"metadata":{"a":{"b":1,"b":2}}}',
    ],
)
def test_duplicate_keys_at_any_depth_are_a_400_on_openai_routes(
    gw: ServerThread, body: bytes
) -> None:
    for path in (b"/v1/chat/completions", b"/v1/embeddings", b"/v1/completions"):
        status, hdrs, doc = send(gw, path, body=body)
        assert_json_error(status, doc, 400)
        assert "twice in one object" in doc["error"]["message"], doc
        assert "x-cache" not in hdrs  # refused before any lookup


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_a_400_on_openai_and_anthropic_routes(
    gw: ServerThread, literal: bytes
) -> None:
    bodies = {
        b"/v1/chat/completions": b'{"model":"m","temperature":0,"top_p":%s,'
        b'"messages":[{"role":"user","content":"hi"}]}',
        b"/v1/embeddings": b'{"model":"m","input":"hi","dimensions":%s}',
        b"/v1/completions": b'{"model":"m","temperature":%s,"prompt":"hi"}',
        b"/v1/messages": b'{"model":"m","max_tokens":5,"temperature":%s,'
        b'"messages":[{"role":"user","content":"hi"}]}',
    }
    for path, body in bodies.items():
        status, _, doc = send(gw, path, body=body % literal)
        # before: 200 (and `Infinity` keyed as `1e999`)
        assert status == 400, (path, doc)
        message = doc["error"]["message"]  # (both envelopes nest it under "error")
        assert f"holds {literal.decode()}, which is not JSON" in message, doc


def test_duplicate_keys_in_the_anthropic_and_v2_bodies_are_a_400(gw: ServerThread) -> None:
    status, _, doc = send(
        gw,
        b"/v1/messages",
        body=b'{"model":"m","max_tokens":5,"max_tokens":9,'
        b'"messages":[{"role":"user","content":"hi"}]}',
    )
    assert status == 400 and doc["type"] == "error", doc
    assert "'max_tokens' twice" in doc["error"]["message"]
    tensor = b'{"name":"x","datatype":"FP32","shape":[1],"data":[1.0],"data":[2.0]}'
    status, _, doc = send(gw, b"/v2/models/m/infer", body=b'{"inputs":[%s]}' % tensor)
    assert status == 400 and "'data' twice" in doc["error"], doc
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"shape":[1],'
    header += b'"parameters":{"binary_data_size":4}}]}'
    status, _, doc = send(
        gw,
        b"/v2/models/m/infer",
        b"Inference-Header-Content-Length: %d\r\n" % len(header),
        header + b"\x00\x00\x80\x3f",
    )
    assert status == 400 and "the inference header has the key 'shape' twice" in doc["error"]


@pytest.mark.parametrize(
    "pairs",
    [[("m", 1), ("m", 2)], [(1, 1), ("1", 2)], [(1, 1), (True, 2)]],
)
def test_a_msgpack_map_with_a_key_twice_is_a_400(gw: ServerThread, pairs: list[Any]) -> None:
    """msgpack maps may repeat a key as JSON objects may; and 1 and "1" are one key to the
    cache key (which spells keys as strings), 1 and true one to a Python dict."""
    bias = bytes([0x80 | len(pairs)]) + b"".join(
        msgpack.packb(k) + msgpack.packb(v) for k, v in pairs
    )
    body = bytes([0x83]) + b"".join(msgpack.packb(x) for x in ("model", "m", "input", "hi"))
    body += msgpack.packb("logit_bias") + bias
    status, _, raw = http(
        "POST",
        f"{gw.url}/v1/embeddings",
        body,
        {"Content-Type": "application/msgpack"},
    )
    doc = json.loads(raw)
    # before: 200 (the key read one value of the two)
    assert_json_error(status, doc, 400)
    assert "the same key twice" in doc["error"]["message"]


def test_msgpack_nested_past_the_unpackers_stack_says_so(gw: ServerThread) -> None:
    """msgpack's StackError has no message: the 400 said "not valid msgpack: " and no more."""
    deep = msgpack.packb("x") + b"\x91" * 5000 + b"\xc0"
    for path, fields in (
        ("/v1/embeddings", 3),
        ("/v1/messages", 4),
        ("/v2/models/m/infer", 2),
    ):
        body = bytes([0x80 | fields]) + b"".join(
            msgpack.packb(k) + msgpack.packb(v)
            for k, v in (("model", "m"), ("input", "hi"), ("max_tokens", 5))[: fields - 1]
        )
        status, _, raw = http(
            "POST", gw.url + path, body + deep, {"Content-Type": "application/msgpack"}
        )
        doc = json.loads(raw)
        assert status == 400, (path, doc)
        err = doc["error"]  # v2 says it as a string, OpenAI and Anthropic in an object
        assert "nested too deeply" in (err if isinstance(err, str) else err["message"]), doc


@pytest.mark.parametrize(
    ("text", "encode"),
    [
        ("in utf-16", lambda s: s.encode("utf-16")),  # with its byte order mark
        ("in utf-16-le", lambda s: s.encode("utf-16-le")),  # without one
        ("in utf-32", lambda s: s.encode("utf-32")),
        ("after a bom", lambda s: b"\xef\xbb\xbf" + s.encode()),
        # a surrogate's own three bytes: not UTF-8, where its \ud800 escape is JSON
        (
            "a lone \ud800",
            lambda s: s.replace("\\ud800", "\ud800").encode("utf-8", "surrogatepass"),
        ),
    ],
)
def test_a_json_body_not_in_utf8_is_a_400_not_its_utf8_twins_hit(
    gw: ServerThread, text: str, encode: Any
) -> None:
    """json.loads takes bytes in UTF-16 or UTF-32, after a byte order mark, and with a
    surrogate's own bytes (it decodes with surrogatepass), and the key read them as the UTF-8
    text. A replica that reads UTF-8 (RFC 8259 8.1: JSON between systems is UTF-8) refuses
    such a body, but once its UTF-8 twin was cached it was a hit. Now a 400 on every route."""
    chat = json.dumps(
        {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]}
    )
    auth = b"Authorization: Bearer sk-one-tenant\r\n"
    status, _, doc = send(gw, b"/v1/chat/completions", auth, chat.encode())  # its UTF-8 twin
    assert status == 200 and doc["choices"][0]["message"]["content"] == f"echo: {text}", doc
    status, hdrs, doc = send(gw, b"/v1/chat/completions", auth, encode(chat))
    # before: 200, X-Cache: hit
    assert_json_error(status, doc, 400)
    assert "x-cache" not in hdrs
    others = {
        b"/v1/messages": {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": text}],
        },
        b"/v1/embeddings": {"model": "m", "input": text},
        b"/v2/models/m/infer": {
            "inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [text]}]
        },
    }
    for path, body in others.items():
        status, _, doc = send(gw, path, body=encode(json.dumps(body)))
        assert status == 400, (path, doc)
