"""The test upstream's OpenAI-compatible endpoints: chat completions (JSON or SSE, with the
X-Test-* stream faults, reasoning, citations, logprobs and the legacy functions API), completions
and embeddings. Answers echo the request (`echo(<name>): <text>`); tests/support/upstream.py
builds the app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from typing import Any

import numpy as np
from aiohttp import web

from tests.support.upstream_base import NAME, common, extra_headers, stats
from tests.support.upstream_base import stream_options_refused as refused_options


def _answer(text: str, app_name: str) -> str:
    return f"echo({app_name}): {text}"


async def _sse(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **extra_headers(request),
        }
    )
    await resp.prepare(request)
    gap = float(request.headers.get("X-Test-Event-Delay", "0"))
    cut = request.headers.get("X-Test-Cut-Stream")
    fail = request.headers.get("X-Test-Stream-Error")
    for i, chunk in enumerate(chunks):
        if cut is not None and i >= int(cut):
            assert request.transport is not None
            request.transport.close()
            return resp
        if fail is not None and i >= int(fail):
            # as vLLM and SGLang report a failure mid-generation: an error event, then [DONE]
            error = {"error": {"message": "CUDA out of memory", "type": "InternalServerError"}}
            await resp.write(f"data: {json.dumps(error)}\n\n".encode())
            break
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if gap:
            await asyncio.sleep(gap)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _token_logprobs(text: str) -> list[dict[str, Any]]:
    """One entry per word, as OpenAI's `logprobs.content` (a word stands in for a token)."""
    out = []
    for i, w in enumerate(text.split(" ")):
        piece = w if i == 0 else " " + w
        out.append({"token": piece, "logprob": -0.5 * (i + 1), "bytes": list(piece.encode())})
    return out


async def chat(request: web.Request) -> web.StreamResponse:
    try:
        if (early := await common(request)) is not None:
            return early
        body = await request.json()
        if (refused := refused_options(body)) is not None:
            return refused
        last = body["messages"][-1].get("content", "")
        text = _answer(last if isinstance(last, str) else json.dumps(last), request.app[NAME])
        rid = "chatcmpl-" + hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
        model = body.get("model", "m")
        reasoning = request.headers.get("X-Test-Reasoning")  # as vLLM's reasoning parsers
        cited = request.headers.get("X-Test-Citation")  # a web-search answer's url_citation
        annotation = {
            "type": "url_citation",
            "url_citation": {"url": cited, "title": "source", "start_index": 0, "end_index": 4},
        }
        functions = body.get("functions")  # the legacy functions API: a function_call answer
        if functions:
            call = {"name": functions[0]["name"], "arguments": json.dumps({"q": last})}
        if body.get("stream"):
            words = [] if functions else text.split(" ")
            chunks = [
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None,
                        }
                    ],
                }
            ]
            extra: list[dict[str, Any]] = []
            if reasoning:
                extra.append({"reasoning_content": reasoning})
            if cited:
                extra.append({"annotations": [annotation]})
            if functions:
                half = len(call["arguments"]) // 2
                extra.append({"function_call": {"name": call["name"], "arguments": ""}})
                extra.append({"function_call": {"arguments": call["arguments"][:half]}})
                extra.append({"function_call": {"arguments": call["arguments"][half:]}})
            for delta in extra:
                chunks.append(
                    {**chunks[0], "choices": [{**chunks[0]["choices"][0], "delta": delta}]}
                )
            for i, w in enumerate(words):
                piece = w if i == 0 else " " + w
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": piece},
                    "finish_reason": None,
                }
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": _token_logprobs(text)[i : i + 1]}
                chunks.append(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": 1700000000,
                        "model": model,
                        "choices": [choice],
                    }
                )
            chunks.append(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {},
                            "finish_reason": "function_call" if functions else "stop",
                        }
                    ],
                }
            )
            if (body.get("stream_options") or {}).get("include_usage"):
                # as OpenAI does: one last chunk with no choices and the call's usage
                n = len(words)
                usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
                chunks.append({**chunks[-1], "choices": [], "usage": usage})
            options = body.get("stream_options") or {}
            if request.headers.get("X-Test-Obfuscation") and options.get("include_obfuscation", 1):
                for c in chunks:
                    c["obfuscation"] = secrets.token_hex(1 + secrets.randbelow(8))
            return await _sse(request, chunks)
        out = {
            "id": rid,
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None if functions else text,
                        **({"reasoning_content": reasoning} if reasoning else {}),
                        **({"annotations": [annotation]} if cited else {}),
                        **({"function_call": call} if functions else {}),
                    },
                    "logprobs": (
                        {"content": _token_logprobs(text), "refusal": None}
                        if body.get("logprobs")
                        else None
                    ),
                    "finish_reason": "function_call" if functions else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": len(text.split()),
                "total_tokens": 3 + len(text.split()),
            },
        }
        return web.json_response(out, headers=extra_headers(request))
    finally:
        stats(request.app)["in_flight"] -= 1


async def completions(request: web.Request) -> web.StreamResponse:
    try:
        if (early := await common(request)) is not None:
            return early
        body = await request.json()
        text = _answer(str(body.get("prompt", "")), request.app[NAME])
        out = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1700000000,
            "model": body.get("model"),
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        }
        return web.json_response(out, headers=extra_headers(request))
    finally:
        stats(request.app)["in_flight"] -= 1


async def embeddings(request: web.Request) -> web.StreamResponse:
    try:
        if (early := await common(request)) is not None:
            return early
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(inputs):
            seed = int.from_bytes(hashlib.sha1(str(text).encode()).digest()[:4], "little")
            vec = np.random.default_rng(seed).standard_normal(8)
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": [float(x) for x in vec / np.linalg.norm(vec)],
                }
            )
        out = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
        return web.json_response(out, headers=extra_headers(request))
    finally:
        stats(request.app)["in_flight"] -= 1
