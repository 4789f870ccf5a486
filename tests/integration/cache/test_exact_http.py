"""The exact cache over HTTP: X-Cache/Age, Cache-Control, Set-Cookie, tenants, admin, msgpack."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import msgpack
import multidict
import pytest

from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import RedisServer, ServerThread

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "what is two plus two"}],
    "temperature": 0,
}


async def _post(
    url: str,
    body: Any = CHAT,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
) -> tuple[int, dict[str, str], bytes]:
    h = {"Authorization": "Bearer sk-alice", **(headers or {})}
    async with aiohttp.ClientSession() as s:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
        async with s.post(url + path, data=data, headers=h) as r:
            return r.status, dict(r.headers), await r.read()


async def _upstream_calls(upstream: ServerThread, path: str = "/v1/chat/completions") -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get(path, 0))


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url))


async def test_miss_then_hit_with_age_and_server_timing(
    upstream: ServerThread, gw: ServerThread
) -> None:
    s1, h1, b1 = await _post(gw.url)
    s2, h2, b2 = await _post(gw.url)
    assert (s1, s2) == (200, 200)
    assert h1["X-Cache"] == "miss" and h2["X-Cache"] == "hit"
    assert b1 == b2
    assert h2["Age"] == "0" and "cache;dur=" in h2["Server-Timing"]
    assert h2["Content-Type"].startswith("application/json")
    assert h2["X-Upstream-Custom"] == "kept"
    assert await _upstream_calls(upstream) == 1


async def test_tenant_a_never_hits_tenant_b(upstream: ServerThread, gw: ServerThread) -> None:
    await _post(gw.url, headers={"Authorization": "Bearer sk-alice"})
    _, h, _ = await _post(gw.url, headers={"Authorization": "Bearer sk-bob"})
    assert h["X-Cache"] == "miss"
    _, h, _ = await _post(gw.url, headers={"Authorization": "Bearer sk-bob"})
    assert h["X-Cache"] == "hit"
    assert await _upstream_calls(upstream) == 2


async def test_request_cache_control(upstream: ServerThread, gw: ServerThread) -> None:
    _, h, _ = await _post(gw.url, headers={"Cache-Control": "no-store"})
    assert h["X-Cache"] == "bypass"
    stages = [part.split(";")[0] for part in h["Server-Timing"].split(", ")]
    assert stages == ["parse", "cache", "upstream", "total"]
    _, h, _ = await _post(gw.url)
    assert h["X-Cache"] == "miss"  # no-store did not store
    _, h, _ = await _post(gw.url, headers={"Cache-Control": "no-cache"})
    assert h["X-Cache"] == "bypass"  # lookup skipped: went upstream again
    assert await _upstream_calls(upstream) == 3
    _, h, _ = await _post(gw.url, headers={"Cache-Control": "max-age=100"})
    assert h["X-Cache"] == "hit"
    _, h, _ = await _post(gw.url, headers={"Cache-Control": "max-age=0"})
    assert h["X-Cache"] == "miss"  # any age is too old for max-age=0
    assert await _upstream_calls(upstream) == 4


async def test_pragma_no_cache_is_read_as_a_list(upstream: ServerThread, gw: ServerThread) -> None:
    """Without a Cache-Control, Pragma's no-cache counts anywhere in its list, and in any of
    its lines (combined: RFC 9110 5.3, RFC 9111 5.4)."""
    _, h, _ = await _post(gw.url)
    assert h["X-Cache"] == "miss"
    lines: list[list[tuple[str, str]]] = [
        [("Pragma", "no-cache")],
        [("Pragma", "no-cache, x-foo")],
        [("Pragma", "x-foo"), ("Pragma", "no-cache")],
        [("Pragma", " no-cache ,")],
    ]
    async with aiohttp.ClientSession() as s:
        for pragma in lines:
            headers = multidict.CIMultiDict(
                [("Authorization", "Bearer sk-alice"), ("Content-Type", "application/json")]
            )
            headers.extend(pragma)
            async with s.post(
                gw.url + "/v1/chat/completions", data=json.dumps(CHAT).encode(), headers=headers
            ) as r:
                await r.read()
                assert r.headers["X-Cache"] == "bypass", pragma
                assert r.headers["X-Cache-Bypass-Reason"] == "no-cache", pragma
    _, h, _ = await _post(gw.url, headers={"Pragma": "x-foo"})
    assert h["X-Cache"] == "hit"


async def test_no_cache_still_stores(upstream: ServerThread, gw: ServerThread) -> None:
    _, h, _ = await _post(gw.url, headers={"Cache-Control": "no-cache"})
    assert h["X-Cache"] == "bypass"
    _, h, _ = await _post(gw.url)
    assert h["X-Cache"] == "hit"


@pytest.mark.parametrize(
    "header",
    [
        {"X-Test-Set-Cookie": "session=1"},
        {"X-Test-Cache-Control": "private"},
        {"X-Test-Cache-Control": "no-store"},
        {"X-Test-Status": "500"},
    ],
)
async def test_uncacheable_responses_are_not_stored(
    upstream: ServerThread, gw: ServerThread, header: dict[str, str]
) -> None:
    for _ in range(2):
        _, h, _ = await _post(gw.url, headers=header)
        assert h["X-Cache"] == "miss"
    assert await _upstream_calls(upstream) == 2


async def test_an_answer_that_arrives_aged_keeps_its_age(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """An upstream cache's answer 50 s old (max-age 60): the miss passes its Age on, a hit
    counts it (RFC 9111 4.2.3: a downstream cache would otherwise keep it 60 s more, not 10),
    and a client's max-age below it is not answered from the entry."""
    aged = {"X-Test-Cache-Control": "max-age=60", "X-Test-Age": "50"}
    _, miss, _ = await _post(gw.url, headers=aged)
    assert (miss["X-Cache"], miss["Age"]) == ("miss", "50")
    _, hit, _ = await _post(gw.url)
    assert hit["X-Cache"] == "hit" and 50 <= int(hit["Age"]) <= 52
    _, young, _ = await _post(gw.url, headers={"Cache-Control": "max-age=30"})
    assert young["X-Cache"] == "miss"


async def test_json_and_msgpack_bodies_share_an_entry(
    upstream: ServerThread, gw: ServerThread
) -> None:
    await _post(gw.url, json.dumps({**CHAT, "temperature": 0.0}).encode())
    _, h, _ = await _post(gw.url, msgpack.packb(CHAT), {"Content-Type": "application/msgpack"})
    assert h["X-Cache"] == "hit"


async def test_passthrough_route_with_cache(upstream: ServerThread, gw: ServerThread) -> None:
    _, h1, b1 = await _post(gw.url, b"opaque", path="/anything?q=1")
    _, h2, b2 = await _post(gw.url, b"opaque", path="/anything?q=1")
    _, h3, _ = await _post(gw.url, b"opaque", path="/anything?q=2")
    assert (h1["X-Cache"], h2["X-Cache"], h3["X-Cache"]) == ("miss", "hit", "miss")
    assert b1 == b2 and json.loads(b1)["body_len"] == 6
    # the key is the target as it goes upstream: an encoded slash is another resource
    _, h4, _ = await _post(gw.url, b"opaque", path="/things/a%2Fb")
    _, h5, _ = await _post(gw.url, b"opaque", path="/things/a/b")
    _, h6, _ = await _post(gw.url, b"opaque", path="/things/a%2Fb")
    assert (h4["X-Cache"], h5["X-Cache"], h6["X-Cache"]) == ("miss", "miss", "hit")


async def _send(
    url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    h = {"Authorization": "Bearer sk-alice", **(headers or {})}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url + path, data=body, headers=h) as r,
    ):
        await r.read()
        return r.status, dict(r.headers)


async def test_passthrough_unsafe_methods_bypass_and_invalidate_the_get(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """PUT, PATCH, DELETE are neither looked up nor stored: each one reaches the upstream. One
    that succeeds drops the cached GET of its target, for its own tenant (RFC 9111 4.4)."""
    for method in ("DELETE", "PUT", "PATCH"):
        for _ in range(2):
            before = await _upstream_calls(upstream, "/items/5")
            status, h = await _send(gw.url, method, "/items/5", b"x" if method != "DELETE" else b"")
            assert (status, h["X-Cache"]) == (200, "bypass")
            assert h["X-Cache-Bypass-Reason"] == "unsafe-method"
            assert await _upstream_calls(upstream, "/items/5") > before
    target = "/items/7?v=1"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "miss"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "hit"
    # another tenant's DELETE, a failed DELETE, a DELETE of another query: the GET stays
    await _send(gw.url, "DELETE", target, headers={"Authorization": "Bearer sk-bob"})
    await _send(gw.url, "DELETE", target, headers={"X-Test-Status": "500"})
    await _send(gw.url, "DELETE", "/items/7?v=2")
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "hit"
    status, _ = await _send(gw.url, "DELETE", target)
    assert status == 200
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "miss"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "hit"


async def test_a_safe_method_invalidates_nothing(upstream: ServerThread, gw: ServerThread) -> None:
    """OPTIONS and TRACE change nothing (RFC 9110 9.2.1): a CORS preflight does not drop the
    cached GET of its target."""
    target = "/items/8"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "miss"
    for method in ("OPTIONS", "TRACE"):
        status, h = await _send(gw.url, method, target)
        assert 200 <= status < 400 and h["X-Cache"] == "bypass"
        assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "hit"


async def test_a_get_in_flight_when_its_target_is_deleted_keeps_no_old_answer(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """A GET still upstream when a DELETE of its target succeeds answers its client, but is not
    stored over the invalidation: the next GET asks the upstream again."""
    target = "/items/9"
    slow = asyncio.create_task(_send(gw.url, "GET", target, headers={"X-Test-Delay": "1"}))
    for _ in range(100):  # the GET is upstream
        async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
            if (await r.json())["in_flight"]:
                break
        await asyncio.sleep(0.05)
    assert (await _send(gw.url, "DELETE", target))[0] == 200
    assert (await slow)[1]["X-Cache"] == "miss"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "miss"
    assert (await _send(gw.url, "GET", target))[1]["X-Cache"] == "hit"


async def _admin(
    url: str, method: str, path: str, body: Any = None, token: str | None = ADMIN_TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url + path, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_admin_stats_and_purge_need_the_token(
    upstream: ServerThread, gw: ServerThread
) -> None:
    await _post(gw.url)
    await _post(gw.url)
    await _post(gw.url, headers={"Authorization": "Bearer sk-bob"})
    assert (await _admin(gw.url, "GET", "/admin/cache/stats", token=None))[0] == 401
    assert (await _admin(gw.url, "GET", "/admin/cache/stats", token="wrong"))[0] == 401
    assert (await _admin(gw.url, "POST", "/admin/cache/purge", {"all": True}, token=None))[0] == 401
    status, stats = await _admin(gw.url, "GET", "/admin/cache/stats")
    assert status == 200
    assert stats["tiers"]["memory"]["entries"] == 2 and stats["tiers"]["memory"]["bytes"] > 0
    assert stats["hits"] == 1 and stats["misses"] == 2
    assert stats["tiers"]["memory"]["hit_ratio"] == pytest.approx(1 / 3)
    assert (await _admin(gw.url, "POST", "/admin/cache/purge", {}))[0] == 400
    assert (await _admin(gw.url, "POST", "/admin/cache/purge", {"route": 3}))[0] == 400
    status, out = await _admin(gw.url, "POST", "/admin/cache/purge", {"tenant": "Bearer sk-bob"})
    assert status == 200 and out["purged"]["memory"] == 1
    _, h, _ = await _post(gw.url)
    assert h["X-Cache"] == "hit"  # alice's entry survived
    _, out = await _admin(gw.url, "POST", "/admin/cache/purge", {"route": "chat", "model": "m"})
    assert out["purged"]["memory"] == 1
    _, h, _ = await _post(gw.url)
    assert h["X-Cache"] == "miss"
    _, out = await _admin(gw.url, "POST", "/admin/cache/purge", {"all": True})
    assert out["purged"]["memory"] == 1


async def test_a_purge_of_no_credentials_is_the_anonymous_tenants(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """{"tenant": {}}: the headers an anonymous client sends, none. Its entries go, Alice's stay."""
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.headers["X-Cache"] == "miss"
        await _post(gw.url)
        status, out = await _admin(gw.url, "POST", "/admin/cache/purge", {"tenant": {}})
        assert status == 200 and out["purged"]["memory"] == 1
        async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.headers["X-Cache"] == "miss"
    assert (await _post(gw.url))[1]["X-Cache"] == "hit"


async def test_metrics_name_hits_misses_and_tiers(upstream: ServerThread, gw: ServerThread) -> None:
    await _post(gw.url)
    await _post(gw.url)
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        text = await r.text()
    assert 'latentgate_cache_lookups_total{result="hit",route="chat",tier="memory"} 1.0' in text
    assert 'latentgate_cache_lookups_total{result="miss",route="chat",tier="-"} 1.0' in text
    assert 'latentgate_cache_entries{tier="memory"} 1.0' in text
    assert "latentgate_cache_lookup_duration_seconds_bucket" in text


async def test_redis_tier_shared_by_two_gateways_and_purged(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], redis_server: RedisServer
) -> None:
    cfg = cache_config(upstream.url, redis_server.url)
    a, b = start_gateway(cfg), start_gateway(cfg)
    _, h, _ = await _post(a.url)
    assert h["X-Cache"] == "miss"
    _, h, _ = await _post(b.url)
    assert h["X-Cache"] == "hit"
    _, stats = await _admin(b.url, "GET", "/admin/cache/stats")
    assert stats["tiers"]["redis"]["hits"] == 1 and stats["tiers"]["redis"]["entries"] == 1
    # the purge on a also reaches b's memory tier, which held the entry since b's hit
    _, out = await _admin(a.url, "POST", "/admin/cache/purge", {"model": "m"})
    assert out["purged"] == {"memory": 1, "redis": 1, "other_processes": "announced"}
    for _ in range(100):
        _, h, _ = await _post(b.url)
        if h["X-Cache"] == "miss":
            break
        await asyncio.sleep(0.05)
    assert h["X-Cache"] == "miss"
    # a purge of another model leaves it alone
    await _admin(a.url, "POST", "/admin/cache/purge", {"model": "other"})
    await asyncio.sleep(1.0)
    _, h, _ = await _post(b.url)
    assert h["X-Cache"] == "hit"


async def test_only_if_cached_answers_from_the_cache_or_504_without_going_upstream(
    upstream: ServerThread, gw: ServerThread
) -> None:
    only = {"Cache-Control": "only-if-cached"}
    status, headers, body = await _post(gw.url, headers=only)
    assert status == 504 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "not_cached"
    assert await _upstream_calls(upstream) == 0
    # a sampled call is never answered from the cache: the same 504, still nothing upstream
    sampled = {**CHAT, "temperature": 0.7}
    assert (await _post(gw.url, body=sampled, headers=only))[0] == 504
    assert (await _post(gw.url, headers={"Cache-Control": "only-if-cached, no-cache"}))[0] == 504
    assert await _upstream_calls(upstream) == 0
    stored = await _post(gw.url)
    status, headers, body = await _post(gw.url, headers=only)
    assert status == 200 and headers["X-Cache"] == "hit" and body == stored[2]
    assert await _upstream_calls(upstream) == 1


async def test_only_if_cached_never_answers_with_another_tenants_entry(
    upstream: ServerThread, gw: ServerThread
) -> None:
    stored = await _post(gw.url, headers={"Authorization": "Bearer sk-alice"})
    assert stored[0] == 200
    bob = {"Authorization": "Bearer sk-bob", "Cache-Control": "only-if-cached"}
    status, _, body = await _post(gw.url, headers=bob)
    assert status == 504 and json.loads(body)["error"]["type"] == "not_cached"
    alice = {"Authorization": "Bearer sk-alice", "Cache-Control": "only-if-cached"}
    status, headers, body = await _post(gw.url, headers=alice)
    assert status == 200 and headers["X-Cache"] == "hit" and body == stored[2]
    assert await _upstream_calls(upstream) == 1


async def test_min_fresh_is_honoured_in_memory_and_in_redis(
    upstream: ServerThread,
    redis_server: RedisServer,
    start_gateway: Callable[..., ServerThread],
) -> None:
    """Cache-Control: min-fresh=N (RFC 9111 5.2.1.3): only an answer that stays fresh N more
    seconds may answer; it used to be ignored."""
    cfg = cache_config(upstream.url, redis_server.url)
    a, b = start_gateway(cfg), start_gateway(cfg)
    body = {**CHAT, "messages": [{"role": "user", "content": f"min-fresh {uuid.uuid4().hex}"}]}
    stored = await _post(a.url, body=body)
    assert stored[1]["X-Cache"] == "miss"
    ttl = cfg["routes"][0]["cache"]["exact"]["ttl"]
    fresh_enough = {"Cache-Control": f"min-fresh={ttl // 2}"}
    too_long = {"Cache-Control": f"min-fresh={ttl * 2}"}
    for gw in (a, b):  # a: its memory tier; b: the shared Redis
        status, headers, _ = await _post(gw.url, body=body, headers=fresh_enough)
        assert status == 200 and headers["X-Cache"] == "hit"
        status, headers, _ = await _post(gw.url, body=body, headers=too_long)
        assert status == 200 and headers["X-Cache"] != "hit"
    calls = await _upstream_calls(upstream)
    # with only-if-cached there is nothing fresh enough to answer with: a 504, not upstream
    only = {"Cache-Control": f"only-if-cached, min-fresh={ttl * 2}"}
    assert (await _post(a.url, body=body, headers=only))[0] == 504
    assert await _upstream_calls(upstream) == calls
