"""A header the upstream's Connection field names is hop-by-hop (RFC 9110 7.6.1): it is for the
gateway alone, so neither the miss nor any later hit passes it on. Before, the miss dropped it
while the stored entry kept it, and every hit (from memory or Redis) replayed it to clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread, one_route, running


async def _answer(request: web.Request) -> web.Response:
    resp = web.Response(text="hop", content_type="text/plain")
    # two Connection lines, names in any case, with options beside them
    resp.headers.add("Connection", "keep-alive, X-Hop-One")
    resp.headers.add("Connection", "x-hop-two")
    resp.headers["X-Hop-One"] = "for the gateway only"
    resp.headers["X-Hop-Two"] = "this one too"
    resp.headers["X-End-To-End"] = "kept"
    return resp


@pytest.fixture
def hop_upstream() -> Iterator[ServerThread]:
    with running(one_route("/{tail:.*}", _answer, method="*")) as server:
        yield server


@pytest.mark.parametrize("tier", ["memory", "redis"])
async def test_headers_the_upstreams_connection_names_are_never_replayed(
    request: pytest.FixtureRequest,
    hop_upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    tier: str,
) -> None:
    redis = request.getfixturevalue("redis_server").url if tier == "redis" else None
    gw = start_gateway(cache_config(hop_upstream.url, redis, tiers=[tier]))
    seen = []
    for _ in range(2):
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/hop") as r:
            assert (r.status, await r.text()) == (200, "hop")
            seen.append(
                (
                    r.headers.get("X-Cache"),
                    r.headers.get("X-End-To-End"),
                    [k for k in r.headers if k.lower().startswith("x-hop")],
                )
            )
    assert seen == [("miss", "kept", []), ("hit", "kept", [])]
