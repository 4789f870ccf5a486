"""One downstream client's upstream state never leaks to another through the shared pool."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from yarl import URL

from tests.conftest import base_config
from tests.support.servers import ServerThread


async def test_upstream_cookies_are_not_kept_for_other_clients(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    # A hostname, not an IP: aiohttp's default cookie jar would store cookies for it.
    gw = start_gateway(base_config(f"http://localhost:{upstream.port}"))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
        async with s.get(
            gw.url + "/login", headers={"X-Test-Set-Cookie": "sid=alice; Path=/"}
        ) as r:
            assert r.status == 200
            assert r.headers["Set-Cookie"] == "sid=alice; Path=/"  # passed through to its client
        async with s.get(gw.url + "/whoami") as r:
            echo = await r.json()
    sent = {k.lower() for k, _ in echo["headers"]}
    assert "cookie" not in sent


async def test_path_and_query_reach_the_upstream_byte_for_byte(gateway: ServerThread) -> None:
    raw = "/files/a%2Fb/%7euser/caf%C3%A9?q=a%2Bb&sp=%20&x=%7e&empty="
    async with (
        aiohttp.ClientSession() as s,
        s.get(URL(gateway.url + raw, encoded=True), allow_redirects=False) as r,
    ):
        echo = await r.json()
    assert echo["raw_path"] == raw
