"""A replica's 2xx JSON nested deeper than json.loads reads (a broken or hostile replica) goes
to its client as sent and is not stored. Before, the store's parse check (gateway/render.py
`_parses`) let json.loads's RecursionError out: the client was told its *request* body was
nested too deeply (a 400), and the flight it led was never settled."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread, one_route, running

DEEP = b"[" * 5000 + b"]" * 5000
CALL = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}


@pytest.fixture
def deep_replica() -> Iterator[tuple[list[int], ServerThread]]:
    calls = [0]

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        calls[0] += 1
        return web.Response(body=DEEP, content_type="application/json")

    with running(one_route("/{tail:.*}", handle)) as server:
        yield calls, server


async def test_a_json_answer_too_deep_for_json_loads_is_relayed_not_stored(
    deep_replica: tuple[list[int], ServerThread], start_gateway: Callable[..., ServerThread]
) -> None:
    calls, server = deep_replica
    gw = start_gateway(cache_config(server.url, tiers=["memory"]))
    async with aiohttp.ClientSession(gw.url) as c:
        for n in (1, 2):
            async with c.post("/v1/chat/completions", json=CALL) as r:
                assert (r.status, await r.read()) == (200, DEEP)  # before: 400, our request blamed
                assert (r.headers["X-Cache"], calls[0]) == ("miss", n)
