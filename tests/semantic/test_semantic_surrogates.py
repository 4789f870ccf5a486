"""A lone surrogate in the context (a system prompt), not in the question: the semantic
namespace's hash raised UnicodeEncodeError in the flight announcement, outside the flow's cache
boundary: a plain-text 500, and an exact flight never settled (every identical request then
waited out coalesce_wait_s)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from tests.semantic.test_gateway import semantic_config
from tests.support.servers import ServerThread

# JSON with a lone-surrogate escape in the system prompt; the last user turn is plain text
BODY = (
    b'{"model": "m", "temperature": 0, "messages": ['
    b'{"role": "system", "content": "be brief \\ud800"},'
    b'{"role": "user", "content": "How do I reset my password?"}]}'
)


def post(url: str) -> tuple[int, str, float]:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=BODY,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-alice"},
    )
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), time.monotonic() - t
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - t


def test_a_surrogate_in_the_system_prompt_is_answered(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = semantic_config(upstream.url)
    gw = start_gateway(cfg)
    status, body, _ = post(gw.url)
    assert status == 200, body
    json.loads(body)


def test_the_same_request_again_is_not_held_by_a_leaked_flight(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = semantic_config(upstream.url)
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["coalesce_wait_s"] = 5
    gw = start_gateway(cfg)
    post(gw.url)
    status, _, took = post(gw.url)
    assert status == 200 and took < 2.0  # (not the 5 s of a flight left open)
