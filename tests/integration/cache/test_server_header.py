"""The gateway names itself `Server: latentgate`, without versions, on every response: a miss
(the upstream's own Server is not passed on, as nginx does), its hits on both hit writers, a
streamed answer, its own errors and admin endpoints. Before, a client read `Python/3.11
aiohttp/3.x.y` (versions to look advisories up for) and a hit named another server than its
miss."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import aiohttp

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import request
from tests.support.servers import GatewayProcess, ServerThread

NAME = "latentgate"


async def test_every_response_names_the_gateway_without_versions(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/items/1") as r:
        assert "aiohttp" in r.headers["Server"]  # the upstream names its own software
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("default",)))
    seen: list[tuple[str, str | None, str]] = []
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-alice"}) as s:
        for _ in range(2):  # a miss, then its hit written in one block
            async with s.get(gw.url + "/items/1") as r:
                seen.append(("GET", r.headers.get("X-Cache"), r.headers.getone("Server")))
        # a hit on a connection that closes goes out through web.Response
        async with s.get(gw.url + "/items/1", headers={"Connection": "close"}) as r:
            seen.append(("close", r.headers.get("X-Cache"), r.headers.getone("Server")))
        async with s.head(gw.url + "/items/1") as r:
            seen.append(("HEAD", r.headers.get("X-Cache"), r.headers.getone("Server")))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.content_type == "text/event-stream"
            await r.read()
            seen.append(("stream", None, r.headers.getone("Server")))
        async with s.post(gw.url + "/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400 and (await r.json())["error"]
            seen.append(("400", None, r.headers.getone("Server")))
        for path in ("/healthz", "/metrics"):
            async with s.get(gw.url + path) as r:
                assert r.status == 200
                seen.append((path, None, r.headers.getone("Server")))
    assert [x for _, x, _ in seen[:3]] == ["miss", "hit", "hit"]
    assert {name for _, _, name in seen} == {NAME}, seen


def test_a_served_process_names_itself_on_model_traffic_too(
    upstream: ServerThread, processes: Callable[..., GatewayProcess]
) -> None:
    """Through `latentgate serve`, whose model traffic skips aiohttp's router (gateway.dispatch)
    and with it the app's response hook: its misses, hits and errors said aiohttp's versions."""
    gw = processes(cache_config(upstream.url, tiers=["memory"], routes=("default",)))
    seen = [request(gw.url + "/items/1")[1] for _ in range(2)]
    assert [h["X-Cache"] for h in seen] == ["miss", "hit"]
    status, headers, _ = request(gw.url + "/v1/chat/completions", "POST", body=b"{not json")
    assert status == 400
    with urllib.request.urlopen(gw.url + "/healthz", timeout=10) as r:
        health = dict(r.headers)
    assert {h["Server"] for h in [*seen, headers, health]} == {NAME}
