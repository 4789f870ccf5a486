"""A purge is not undone by what was in flight when it ran: a Redis read that answers after it
is not promoted into memory, an upstream answer to a call that began before it is not stored."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import RedisServer, ServerThread
from tests.support.upstream import build_upstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "purge race"}], "temperature": 0}


async def _post(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    h = {"Content-Type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", data=json.dumps(CHAT), headers=h) as r,
    ):
        await r.read()
        return r.status, r.headers.get("X-Cache", "")


async def _purge(url: str, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/admin/cache/purge", json=selector or {"all": True}, headers=auth) as r,
    ):
        assert r.status == 200
        return dict(await r.json())


class HoldingProxy:
    """A TCP proxy in front of Redis that, once armed, holds the replies of the first
    connection to send an MGET (the exact tier's read) until released."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed = False
        self.holding = asyncio.Event()  # the held connection's reply has arrived here
        self.released = asyncio.Event()
        self._held: object = None
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.close()

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        rr, rw = await asyncio.open_connection("127.0.0.1", self.target_port)
        me = object()

        async def up() -> None:
            while data := await cr.read(65536):
                if self.armed and self._held is None and b"\r\nMGET\r\n" in data.upper():
                    self.armed, self._held = False, me
                rw.write(data)
                await rw.drain()
            rw.close()

        async def down() -> None:
            while data := await rr.read(65536):
                if self._held is me and not self.released.is_set():
                    self.holding.set()
                    await self.released.wait()
                cw.write(data)
                await cw.drain()
            cw.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            rw.close()
            cw.close()


def _held_upstream(arrived: threading.Event, release: threading.Event) -> Callable[[], Any]:
    """The test upstream, except that a request with X-Test-Hold waits for `release`."""

    def build() -> web.Application:
        app = build_upstream()

        @web.middleware
        async def hold(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if request.headers.get("X-Test-Hold"):
                arrived.set()
                await asyncio.to_thread(release.wait, 30)
            return await handler(request)

        app.middlewares.append(hold)
        return app

    return build


async def test_a_redis_read_answered_after_a_purge_is_not_promoted_into_memory(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], redis_server: RedisServer
) -> None:
    proxy = await HoldingProxy(redis_server.port).start()
    try:
        cfg = cache_config(upstream.url, redis_server.url, routes=("chat",))
        a_cfg = json.loads(json.dumps(cfg))
        a_cfg["cache"]["redis"]["url"] = f"redis://127.0.0.1:{proxy.port}/0"
        a_cfg["cache"]["redis"]["timeouts"] = {"op": 30.0}
        a, b = start_gateway(a_cfg), start_gateway(cfg)
        assert await _post(b.url) == (200, "miss")  # in Redis; a's memory is empty
        proxy.armed = True
        racing = asyncio.create_task(_post(a.url))
        await asyncio.wait_for(proxy.holding.wait(), 30)  # Redis answered a's read: the entry
        out = await _purge(a.url)
        assert out["purged"]["redis"] == 1
        proxy.released.set()  # ... which reaches a only after the purge returned
        assert await racing == (200, "hit")  # (it still answers the call that asked)
        assert await _post(a.url) == (200, "miss")
        assert await _post(a.url) == (200, "hit")  # and that miss was stored again
    finally:
        await proxy.aclose()


async def test_an_answer_computed_across_a_purge_is_not_stored(
    start_gateway: Callable[..., ServerThread],
) -> None:
    arrived, release = threading.Event(), threading.Event()
    up = ServerThread(_held_upstream(arrived, release)).start()
    try:
        gw = start_gateway(cache_config(up.url, None, tiers=["memory"], routes=("chat",)))
        slow = asyncio.create_task(_post(gw.url, {"X-Test-Hold": "1"}))
        assert await asyncio.to_thread(arrived.wait, 30)  # the miss is upstream
        await _purge(gw.url)
        release.set()
        assert await slow == (200, "miss")
        assert await _post(gw.url) == (200, "miss")  # the purge's effect holds
        assert await _post(gw.url) == (200, "hit")  # and the next answer is stored
    finally:
        release.set()
        up.stop()


@pytest.mark.parametrize(
    "selector", [{"route": "embeddings"}, {"tenant": "Bearer sk-carol"}], ids=["route", "tenant"]
)
async def test_a_purge_of_something_else_does_not_cost_an_answer_in_flight_its_store(
    start_gateway: Callable[..., ServerThread], selector: dict[str, Any]
) -> None:
    """A purge skips the stores of calls in flight only where it matches their keys: another
    route's or another tenant's purge leaves this answer to be stored as usual."""
    arrived, release = threading.Event(), threading.Event()
    up = ServerThread(_held_upstream(arrived, release)).start()
    try:
        gw = start_gateway(cache_config(up.url, None, tiers=["memory"]))
        alice = {"Authorization": "Bearer sk-alice"}
        slow = asyncio.create_task(_post(gw.url, {**alice, "X-Test-Hold": "1"}))
        assert await asyncio.to_thread(arrived.wait, 30)  # the miss is upstream
        await _purge(gw.url, selector)
        release.set()
        assert await slow == (200, "miss")
        assert await _post(gw.url, alice) == (200, "hit")
    finally:
        release.set()
        up.stop()
