"""A semantic namespace reads a request's context as its exact key does: a msgpack bin value is
not the string of its hex digits. The namespace once spelled bytes as hex, so a JSON call whose
system prompt was "416e73..." was a semantic hit on the answer to a msgpack call whose system
prompt was the bytes b"Answer in French." (the exact key, which tags bin values, kept them apart).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from aiohttp import web

from tests.semantic.test_gateway import semantic_config
from tests.support.servers import ServerThread, one_route, running

SYSTEM = b"Answer in French."


async def chat(request: web.Request) -> web.Response:
    """Reads JSON or msgpack (bin as bytes) and says which system prompt it answered under."""
    raw = await request.read()
    msgpack_body = "msgpack" in (request.content_type or "")
    body = msgpack.unpackb(raw, raw=False) if msgpack_body else json.loads(raw)
    system = body["messages"][0]["content"]
    said = system.decode() if isinstance(system, bytes) else system
    content = f"[{said}] {body['messages'][-1]['content']}"
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
        }
    )


@pytest.fixture
def gw(start_gateway: Callable[..., ServerThread]) -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", chat)) as upstream:
        yield start_gateway(semantic_config(upstream.url))


def post(url: str, body: bytes, ctype: str) -> tuple[str, str]:
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": ctype, "Authorization": "Bearer sk-a"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return r.headers["X-Cache"], doc["choices"][0]["message"]["content"]


def call(system: Any, question: str) -> dict[str, Any]:
    return {
        "model": "m",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def test_a_bin_system_prompt_is_not_the_namespace_of_its_hex_spelling(gw: ServerThread) -> None:
    packed = msgpack.packb(call(SYSTEM, "How do I reset my password?"), use_bin_type=True)
    assert post(gw.url, packed, "application/msgpack") == (
        "miss",
        "[Answer in French.] How do I reset my password?",
    )
    hexed = json.dumps(call(SYSTEM.hex(), "How can I reset my password?")).encode()
    assert post(gw.url, hexed, "application/json") == (
        "miss",
        f"[{SYSTEM.hex()}] How can I reset my password?",
    )
    # a paraphrase under the bin prompt itself is still served from its entry
    again = msgpack.packb(call(SYSTEM, "How can I reset my password?"), use_bin_type=True)
    assert post(gw.url, again, "application/msgpack")[0] == "semantic-hit"
