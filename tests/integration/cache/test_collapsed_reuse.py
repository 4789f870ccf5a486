"""Identical requests collapsed onto one upstream call get its answer only where the cache could
serve them that answer from its store (RFC 9111 4). An answer that says `no-cache`, or that has
no freshness left (`max-age=0`, `s-maxage=0`), is for its own request: the waiters of its
flight fetch their own. Before, every waiter got the leader's answer (and its `id`)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

_GATE: web.AppKey[threading.Event] = web.AppKey("gate", threading.Event)
_CALLS: web.AppKey[list[int]] = web.AppKey("calls", list)
_WAITERS = re.compile(r"^latentgate_cache_singleflight_waiters (\S+)$", re.M)


def _gated() -> web.Application:
    """A replica that numbers each call and holds its answer until the test opens its gate."""

    async def answer(request: web.Request) -> web.Response:
        request.app[_CALLS].append(1)
        n = len(request.app[_CALLS])
        await asyncio.to_thread(request.app[_GATE].wait, 30)
        headers = {"Cache-Control": request.headers["X-Answer-Cache-Control"]}
        return web.json_response({"n": n}, headers=headers)

    app = web.Application()
    app[_GATE] = threading.Event()
    app[_CALLS] = []
    app.router.add_get("/answer", answer)
    return app


@pytest.fixture
def gated() -> Iterator[ServerThread]:
    server = ServerThread(_gated).start()
    yield server
    assert server.app is not None
    server.app[_GATE].set()
    server.stop()


async def _waiters(s: aiohttp.ClientSession, url: str) -> float:
    async with s.get(url + "/metrics") as r:
        found = _WAITERS.search(await r.text())
    return float(found.group(1)) if found else 0.0


async def _until(
    leader_there: Callable[[], bool], s: aiohttp.ClientSession, url: str, waiters: int
) -> None:
    """Until the leader is with the replica and `waiters` requests wait on its flight (both
    live in other threads: polled)."""
    for _ in range(1000):
        if leader_there() and await _waiters(s, url) == waiters:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the requests never gathered on one flight")


@pytest.mark.parametrize(
    ("cache_control", "upstream_calls"),
    [("no-cache", 3), ("max-age=0", 3), ("s-maxage=0, max-age=600", 3), ("max-age=600", 1)],
)
async def test_waiters_get_the_leaders_answer_only_where_the_cache_could_reuse_it(
    gated: ServerThread,
    start_gateway: Callable[..., ServerThread],
    cache_control: str,
    upstream_calls: int,
) -> None:
    gw = start_gateway(cache_config(gated.url, tiers=["memory"], routes=("default",)))
    assert gated.app is not None
    headers = {"X-Answer-Cache-Control": cache_control}
    async with aiohttp.ClientSession() as s:

        async def get() -> tuple[str, object]:
            async with s.get(gw.url + "/answer", headers=headers) as r:
                assert r.status == 200
                return r.headers["X-Cache"], (await r.json())["n"]

        asks = [asyncio.create_task(get()) for _ in range(3)]
        # the leader is with the replica and the other two wait on its flight
        await _until(lambda: bool(gated.app and gated.app[_CALLS]), s, gw.url, waiters=2)
        gated.app[_GATE].set()
        answers = await asyncio.gather(*asks)
    assert len(gated.app[_CALLS]) == upstream_calls
    numbers = sorted(n for _, n in answers)
    assert numbers == ([1, 2, 3] if upstream_calls == 3 else [1, 1, 1]), answers
