"""The test upstream's Anthropic Messages API: POST /v1/messages, JSON or SSE.

Answers deterministically from the request: the text is `echo(<name>): <last user text>`, cut
to max_tokens words (stop_reason max_tokens); with `tool_choice: {type: tool, name: X}` the
answer is one tool_use block calling X with {"echo": <text>}. The message id is a hash of the
request without `stream`, so a streamed and a plain answer describe the same message. The
stream is what the API sends: message_start, a ping, per block start / deltas / stop,
message_delta, message_stop. X-Test-Cut-Stream / X-Test-Event-Delay / X-Test-Status work as on
the OpenAI endpoints.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from aiohttp import web


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content", "")
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content if b.get("type") == "text")


def message_for(body: dict[str, Any], name: str) -> dict[str, Any]:
    words = f"echo({name}): {_last_user_text(body['messages'])}".split(" ")
    limit = int(body.get("max_tokens", 1024))
    stop = "max_tokens" if len(words) > limit else "end_turn"
    text = " ".join(words[:limit])
    key = {k: v for k, v in body.items() if k != "stream"}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
    choice = body.get("tool_choice") or {}
    content: list[dict[str, Any]]
    if choice.get("type") == "tool":
        content = [
            {
                "type": "tool_use",
                "id": "toolu_" + digest[:12],
                "name": choice["name"],
                "input": {"echo": text},
            }
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": text}]
    return {
        "id": "msg_" + digest[:16],
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": len(json.dumps(body["messages"])) // 4,
            "output_tokens": len(words[:limit]),
        },
    }


def event(kind: str, **doc: Any) -> bytes:
    """One Messages API SSE event: its name, and its data with the `type` the API repeats."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **doc})}\n\n".encode()


def stream_events(msg: dict[str, Any]) -> list[bytes]:
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**msg["usage"], "output_tokens": 1}
    out = [event("message_start", message=start), event("ping")]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            out.append(event("content_block_start", index=i, content_block={**block, "text": ""}))
            for n, word in enumerate(block["text"].split(" ")):
                delta = {"type": "text_delta", "text": word if n == 0 else " " + word}
                out.append(event("content_block_delta", index=i, delta=delta))
        else:
            start_block = {**block, "input": {}}
            out.append(event("content_block_start", index=i, content_block=start_block))
            raw = json.dumps(block["input"])
            for part in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                delta = {"type": "input_json_delta", "partial_json": part}
                out.append(event("content_block_delta", index=i, delta=delta))
        out.append(event("content_block_stop", index=i))
    delta = {"stop_reason": msg["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": msg["usage"]["output_tokens"]}
    out.append(event("message_delta", delta=delta, usage=usage))
    out.append(event("message_stop"))
    return out


async def write_stream(
    request: web.Request, events: list[bytes], headers: dict[str, str]
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    gap = float(request.headers.get("X-Test-Event-Delay", "0"))
    cut = request.headers.get("X-Test-Cut-Stream")
    for i, framed in enumerate(events):
        if cut is not None and i >= int(cut):
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(framed)
        if gap:
            await asyncio.sleep(gap)
    await resp.write_eof()
    return resp
