"""Two gateways on one Redis whose routes key requests differently (a rollout of a new key
policy, config drift between sidecars) share no entries, so neither serves the other an answer
its own policy tells apart. Before, a sidecar counting X-Tenant as a credential answered its
anonymous clients with what a sidecar that does not count it had stored for `X-Tenant: t1`
(the same key: both took that request for the anonymous tenant), and a field one route
ignores was answered from the other's entry for another value of it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from cache.keys import KeyBuilder, key_scope
from cache.tenant import TenantHasher
from tests.integration.cache.conftest import cache_config
from tests.ops.conftest import http
from tests.support.servers import RedisServer, ServerThread, one_route, running


async def _answer(request: web.Request) -> web.Response:
    """Each answer says whom and what it was for: a shared entry shows in the body."""
    body = await request.json()
    said = f"for {request.headers.get('X-Tenant', 'nobody')}, note {body.get('note', '-')}"
    return web.json_response(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": said},
                    "finish_reason": "stop",
                }
            ],
        }
    )


@pytest.fixture
def upstream_says_whom() -> Iterator[ServerThread]:
    with running(one_route("/v1/chat/completions", _answer)) as server:
        yield server


def _config(upstream: str, redis_url: str, **key: list[str]) -> dict[str, Any]:
    cfg = cache_config(upstream, redis_url, routes=("chat",), tiers=["redis"])
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["key"] = key
    return cfg


def _chat(gw: ServerThread, headers: dict[str, str], **fields: str) -> tuple[str, str]:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    status, h, raw = http(
        "POST",
        gw.url + "/v1/chat/completions",
        json.dumps({**body, **fields}).encode(),
        {"Content-Type": "application/json", **headers},
    )
    assert status == 200, raw
    return h["X-Cache"], json.loads(raw)["choices"][0]["message"]["content"]


def test_sidecars_that_count_other_credentials_share_no_entries(
    upstream_says_whom: ServerThread,
    redis_server: RedisServer,
    start_gateway: Callable[..., ServerThread],
) -> None:
    plain = _config(upstream_says_whom.url, redis_server.url)
    tenants = copy.deepcopy(plain)
    for r in tenants["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["key"] = {"tenant_headers": ["X-Tenant"]}
    old, new = start_gateway(plain), start_gateway(tenants)

    assert _chat(old, {"X-Tenant": "t1"}) == ("miss", "for t1, note -")
    # the new policy's anonymous client is not t1
    assert _chat(new, {}) == ("miss", "for nobody, note -")
    assert _chat(new, {"X-Tenant": "t1"}) == ("miss", "for t1, note -")
    assert _chat(new, {"X-Tenant": "t1"}) == ("hit", "for t1, note -")
    assert _chat(old, {"X-Tenant": "t2"}) == ("hit", "for t1, note -")  # its own policy


def test_sidecars_that_ignore_other_fields_share_no_entries(
    upstream_says_whom: ServerThread,
    redis_server: RedisServer,
    start_gateway: Callable[..., ServerThread],
) -> None:
    cfg = _config(upstream_says_whom.url, redis_server.url, ignore_fields=["note"])
    plain = copy.deepcopy(cfg)  # (one key prefix: cache_config draws one per call)
    for r in plain["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["key"] = {}
    ignoring, keying = start_gateway(cfg), start_gateway(plain)
    assert _chat(ignoring, {}, note="a") == ("miss", "for nobody, note a")
    # the route that keys `note` was a hit on the answer to note "a" for a request without it
    assert _chat(keying, {}) == ("miss", "for nobody, note -")
    assert _chat(ignoring, {}, note="b") == ("hit", "for nobody, note a")  # its own policy


def test_the_default_policy_keeps_its_keys() -> None:
    """A key builder without extra credential headers, ignored fields or an upstream keys as
    before; a built-in header listed among tenant_headers changes nothing. (The gateway names
    every route's upstream: tests/ops/test_reload_cache.py.)"""
    assert key_scope([], []) == key_scope(["Authorization", " cookie "], []) == ""
    assert key_scope(["X-Tenant"], []) == key_scope(["x-tenant", "Authorization"], [])
    hasher = TenantHasher(b"s" * 32)
    fields = {"messages": [{"role": "user", "content": "q"}]}
    key = KeyBuilder("chat", [], hasher).build("m", fields, {}).value
    # what the release before key scopes built for it
    assert (
        key == "f4b9072f0eaeb42c.b3030da20464028c.6505f70636d1416a.8d7f00a46ce424b4410f15eb35e8619d"
    )
    assert key == KeyBuilder("chat", ["api-key"], hasher, ()).build("m", fields, {}).value
    plain = KeyBuilder("chat", [], hasher).build("m", fields, {})
    other = KeyBuilder("chat", ["X-Tenant"], hasher).build("m", fields, {})
    assert other.value != key and other.tenant_h == plain.tenant_h  # purges by tenant match
    # the semantic stage's namespaces and tenant labels are the policy's own too
    assert plain.tenant_scope == plain.tenant_h and other.tenant_scope != plain.tenant_scope
    # what the answers come from is scoped the same way
    a, b = (KeyBuilder("chat", [], hasher, (), up).build("m", fields, {}) for up in ("a", "b"))
    assert len({a.value, b.value, key}) == 3 and len({a.tenant_scope, b.tenant_scope}) == 2
