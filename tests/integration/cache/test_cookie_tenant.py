"""A session cookie is a credential: two clients whose Cookie differs never share a cached
answer, on a passthrough route as on an API route.

Before: Cookie was not part of the tenant, so an answer to `Cookie: sid=alice` that the upstream
did not mark private (nor Vary on Cookie, nor Set-Cookie) was a hit for `sid=bob` (RFC 9111
allows that; a gateway that promises tenants never share answers must not).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread


def _get(url: str, cookie: str | None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers["x-cache"], resp.read()


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url, tiers=["memory"]))


def test_clients_with_another_cookie_do_not_share_an_answer(gw: ServerThread) -> None:
    url = gw.url + "/account/summary"
    assert _get(url, "sid=alice")[0] == "miss"
    assert _get(url, "sid=alice")[0] == "hit"
    assert _get(url, "sid=bob")[0] == "miss"  # before: a hit with the answer for alice
    assert _get(url, None)[0] == "miss"  # nor the anonymous tenant
    assert _get(url, "sid=bob")[0] == "hit"


def test_a_chat_call_with_another_cookie_is_another_tenant(gw: ServerThread) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}

    def post(cookie: str) -> str:
        req = urllib.request.Request(
            gw.url + "/v1/chat/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json", "Cookie": cookie},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return str(resp.headers["x-cache"])

    assert post("sid=alice") == "miss"
    assert post("sid=alice") == "hit"
    assert post("sid=bob") == "miss"
