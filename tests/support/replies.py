"""Scripted upstream answers, for a stand-in replica that has to speak exactly as one real server
does: its SSE written event by event, or its JSON, as the request's `stream` asks."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def sse(request: web.Request, events: Iterable[bytes]) -> web.StreamResponse:
    """`events` as a text/event-stream answer, each written as it is (already framed)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event)
    return resp


async def openai_sse(request: web.Request, chunks: Iterable[dict[str, Any]]) -> web.StreamResponse:
    """Each chunk as one `data:` event, then `data: [DONE]`, as OpenAI-compatible servers stream."""
    framed = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks]
    return await sse(request, [*framed, b"data: [DONE]\n\n"])


def json_or_stream(
    message: Callable[[], dict[str, Any]], events: Callable[[], list[bytes]]
) -> Handler:
    """A handler answering `message()` as JSON, or `events()` as SSE when the request streams."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(message())
        return await sse(request, events())

    return handle
