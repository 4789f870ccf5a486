"""`/v1/chat/completions/` and `/v1/chat/completions` are two URIs (RFC 9110 4.2.3): a route
whose path matches both forwards each as sent, and the cache keeps their answers apart.

Before: the OpenAI adapter keyed the path without its trailing slash and the Messages adapter
keyed no path, so the answer stored for one was served for the other, whatever the upstream
said to the path with the slash (here the stand-in has no such endpoint: its echo answers).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.support.servers import ServerThread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}
MESSAGES = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"x-api-key": "sk-ant-alice", "anthropic-version": "2023-06-01"}


def post_json(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str, Any]:
    """(status, X-Cache, JSON body) of one POST."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, resp.headers["x-cache"], json.loads(resp.read())


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = cache_config(upstream.url, tiers=["memory"])
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [("/v1/chat/completions", CHAT, {}), ("/v1/messages", MESSAGES, HEADERS)],
    ids=["openai", "anthropic"],
)
def test_a_trailing_slash_is_another_entry(
    gw: ServerThread, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    def post(p: str) -> tuple[int, str, Any]:
        return post_json(gw.url + p, body, headers)

    status, cache, first = post(path)
    assert status == 200 and cache == "miss"
    assert post(path)[1] == "hit"

    status, cache, slash = post(path + "/")
    assert cache == "miss"  # before: a hit, with the answer stored for `path`
    assert status == 200 and slash["path"] == path + "/"  # the upstream's answer to that URI
    assert post(path + "/") == (200, "hit", slash)
    assert post(path) == (200, "hit", first)
