"""A real HTTP model server for tests and benchmarks: OpenAI-compatible
(tests/support/upstream_openai.py), the Anthropic Messages API (tests/support/upstream_anthropic.py)
and Open Inference v2 (tests/support/upstream_v2.py).

Behaviour on demand through request headers:
  X-Test-Status: N        answer with status N and an OpenAI-style error body
  X-Test-Retry-After: v   ... and Retry-After: v with it
  X-Test-Delay: S         sleep S seconds before answering
  X-Test-Event-Delay: S   sleep S seconds between SSE events
  X-Test-Cut-Stream: N    close the connection after N SSE events (no [DONE])
  X-Test-Stream-Error: N  after N SSE events an error event, then [DONE] (as vLLM does)
  X-Test-Set-Cookie: v    add Set-Cookie: v
  X-Test-Cache-Control: v add Cache-Control: v
  X-Test-Age: v           add Age: v (an answer that comes from a cache upstream)
  X-Test-Vary: name       add Vary: name, and X-Varied-Value: the request's value of it
  X-Test-Vendor-Headers: 1  add OpenAI's and Anthropic's per-answer headers (ids, rate limit)
  X-Test-Reasoning: t     chat answers carry reasoning_content t (as vLLM's reasoning parsers)
  X-Test-Citation: url    chat answers carry a url_citation annotation
  X-Test-Obfuscation: 1   chat stream chunks carry random `obfuscation` padding, as OpenAI's
                          do unless stream_options.include_obfuscation is false
It counts TCP/unix connections and requests per path (GET /_test/stats, POST /_test/reset).
Run standalone: python -m tests.support.upstream --port 8000 [--uds PATH] [--name NAME]
  [--delay S] [--fail-status N [--retry-after V]]: this process delays / fails every model
  call (fault injection for one replica of a pool; health endpoints stay fast and 200).
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter
from typing import Any

from aiohttp import web

from tests.support.upstream_anthropic import message_for, stream_events, write_stream
from tests.support.upstream_base import FAULTS, NAME, STATS, common, extra_headers, stats
from tests.support.upstream_openai import chat, completions, embeddings
from tests.support.upstream_v2 import SEQUENCES, v2_infer, v2_model, v2_server


async def messages(request: web.Request) -> web.StreamResponse:
    try:
        if (early := await common(request)) is not None:
            return early
        body = await request.json()
        msg = message_for(body, request.app[NAME])
        if body.get("stream"):
            return await write_stream(request, stream_events(msg), extra_headers(request))
        return web.json_response(msg, headers=extra_headers(request))
    finally:
        stats(request.app)["in_flight"] -= 1


async def models(request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]}
    )


async def health(request: web.Request) -> web.Response:
    stats(request.app)["requests"][request.path] += 1
    return web.Response(status=200)


DOCUMENT = bytes(range(65, 91)) * 4  # 104 bytes, A-Z four times
DOCUMENT_ETAG = '"doc-v1"'


async def document(request: web.Request) -> web.Response:
    """GET /_test/doc: one fixed document with an ETag, honouring If-None-Match (304) and a
    single Range (206), as a file server does."""
    if (early := await common(request)) is not None:
        stats(request.app)["in_flight"] -= 1
        return early  # type: ignore[return-value]
    stats(request.app)["in_flight"] -= 1
    headers = {"ETag": DOCUMENT_ETAG, "Accept-Ranges": "bytes", **extra_headers(request)}
    if request.headers.get("If-None-Match") == DOCUMENT_ETAG:
        return web.Response(status=304, headers=headers)
    if "Range" in request.headers:
        r = request.http_range
        start, stop = r.start or 0, min(r.stop or len(DOCUMENT), len(DOCUMENT))
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(DOCUMENT)}"
        return web.Response(status=206, body=DOCUMENT[start:stop], headers=headers)
    return web.Response(body=DOCUMENT, headers=headers, content_type="text/plain")


async def echo(request: web.Request) -> web.Response:
    """Passthrough target: echoes method, path, query, headers and body length."""
    st = stats(request.app)
    if (early := await common(request)) is not None:  # (counts the request and connection)
        st["in_flight"] -= 1
        return early  # type: ignore[return-value]
    st["in_flight"] -= 1
    body = await request.read()
    return web.json_response(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "raw_path": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body_len": len(body),
            "body_sha1": hashlib.sha1(body).hexdigest(),
        },
        headers=extra_headers(request),
    )


async def test_stats(request: web.Request) -> web.Response:
    st = stats(request.app)
    return web.json_response(
        {
            "connections": len(st["connections"]),
            "requests": dict(st["requests"]),
            "in_flight": st["in_flight"],
        }
    )


async def test_reset(request: web.Request) -> web.Response:
    request.app[STATS].update(_fresh_stats())
    return web.json_response({"ok": True})


def _fresh_stats() -> dict[str, Any]:
    return {"connections": set(), "requests": Counter(), "in_flight": 0}


def build_upstream(
    name: str = "up",
    delay: float | None = None,
    fail_status: int | None = None,
    retry_after: str | None = None,
) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app[NAME] = name
    app[FAULTS] = {"delay": delay, "fail_status": fail_status, "retry_after": retry_after}
    app[STATS] = _fresh_stats()
    app[SEQUENCES] = {}
    r = app.router
    r.add_get("/_test/stats", test_stats)
    r.add_post("/_test/reset", test_reset)
    r.add_get("/_test/doc", document)
    r.add_post("/v1/chat/completions", chat)
    r.add_post("/openai/deployments/{deployment}/chat/completions", chat)  # Azure OpenAI clients
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/embeddings", embeddings)
    r.add_post("/v1/messages", messages)
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_get("/v2", v2_server)
    r.add_get("/v2/health/live", health)
    r.add_get("/v2/health/ready", health)
    r.add_get("/v2/models/{name}", v2_model)
    r.add_get("/v2/models/{name}/ready", health)
    r.add_post("/v2/models/{name}/infer", v2_infer)
    r.add_post("/v2/models/{name}/versions/{version}/infer", v2_infer)
    r.add_route("*", "/{tail:.*}", echo)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--uds")
    ap.add_argument("--name", default="up")
    ap.add_argument("--delay", type=float, help="seconds to sleep before every model call")
    ap.add_argument("--fail-status", type=int, help="answer every model call with this status")
    ap.add_argument("--retry-after", help="... and this Retry-After with it")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = build_upstream(args.name, args.delay, args.fail_status, args.retry_after)
    where = f"unix:{args.uds}" if args.uds else f"http://{args.host}:{args.port}"
    print(
        f"example upstream {args.name!r} on {where}: OpenAI chat/completions/embeddings echo "
        "and v2 infer (x2), for trying the gateway (Ctrl-C stops it)",
        flush=True,
    )
    if args.uds:
        web.run_app(app, path=args.uds, print=None, access_log=None)
    else:
        web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
