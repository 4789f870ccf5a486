"""What every handler of the test upstream shares: its app keys, fault injection, the headers it
adds, and the request counters (tests/support/upstream.py builds the app)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp import web

NAME = web.AppKey("name", str)
FAULTS = web.AppKey("faults", dict)
STATS = web.AppKey("stats", dict)


def stats(app: web.Application) -> dict[str, Any]:
    return app[STATS]


async def common(request: web.Request) -> web.StreamResponse | None:
    st = stats(request.app)
    st["connections"].add(id(request.protocol))
    st["requests"][request.path] += 1
    st["in_flight"] += 1
    faults = request.app.get(FAULTS) or {}
    delay = request.headers.get("X-Test-Delay") or faults.get("delay")
    if delay:
        await asyncio.sleep(float(delay))
    status = request.headers.get("X-Test-Status") or faults.get("fail_status")
    if status:
        body = {
            "error": {
                "message": f"injected {status}",
                "type": "test_error",
                "param": None,
                "code": int(status),
            }
        }
        headers = {"X-Upstream": request.app[NAME]}
        if after := request.headers.get("X-Test-Retry-After") or faults.get("retry_after"):
            headers["Retry-After"] = after
        return web.json_response(body, status=int(status), headers=headers)
    return None


def extra_headers(request: web.Request) -> dict[str, str]:
    h = {"X-Upstream": request.app[NAME], "X-Upstream-Custom": "kept"}
    if v := request.headers.get("X-Test-Set-Cookie"):
        h["Set-Cookie"] = v
    if v := request.headers.get("X-Test-Cache-Control"):
        h["Cache-Control"] = v
    if v := request.headers.get("X-Test-Age"):
        h["Age"] = v
    if v := request.headers.get("X-Test-Vary"):
        # the answer depends on that request header: Vary names it, X-Varied-Value shows it
        h["Vary"] = v
        h["X-Varied-Value"] = request.headers.get(v, "")
    if request.headers.get("X-Test-Vendor-Headers"):
        h.update(vendor_headers(request.app))
    return h


def vendor_headers(app: web.Application) -> dict[str, str]:
    """What OpenAI and Anthropic send with each answer: facts of that one exchange (its ids,
    its time, the rate limit left after it: a new id and one fewer request each time) beside
    facts of the answer (its model, organization, API version)."""
    served = sum(stats(app)["requests"].values())
    return {
        "x-request-id": f"req_{uuid.uuid4().hex}",
        "request-id": f"req_{uuid.uuid4().hex}",
        "cf-ray": f"{uuid.uuid4().hex[:16]}-AMS",
        "openai-processing-ms": "412",
        "x-envoy-upstream-service-time": "415",
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": str(10000 - served),
        "x-ratelimit-reset-requests": "6ms",
        "anthropic-ratelimit-requests-remaining": str(4000 - served),
        "openai-model": "gpt-test-2025",
        "openai-organization": "org-test",
        "openai-version": "2020-10-01",
    }


def stream_options_refused(body: dict[str, Any]) -> web.Response | None:
    """OpenAI and vLLM refuse stream_options on a call that does not stream (400, "The
    'stream_options' parameter is only allowed when 'stream' is enabled"), and options that
    are not booleans ("Invalid type for 'stream_options.include_usage'")."""
    options = body.get("stream_options")
    message = None
    if options and not body.get("stream"):
        message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    elif options is not None and not (
        isinstance(options, dict) and all(isinstance(v, bool) for v in options.values())
    ):
        message = "Invalid type for 'stream_options': expected booleans."
    if message is None:
        return None
    error = {"message": message, "type": "invalid_request_error", "param": "stream_options"}
    return web.json_response({"error": {**error, "code": None}}, status=400)
