"""A credential header spelled with underscores (`x_api_key`) is a credential too.

A CGI-style server (a WSGI bridge such as a2wsgi, cheroot, uWSGI) reads `x_api_key` and
`x-api-key` as one variable, HTTP_X_API_KEY, so the key reaches its application whichever way
it was spelled. The upstream here reads headers that way. Before, the gateway did not count
the underscored spelling: an answer fetched with `x_api_key: alpha` was stored under the
anonymous tenant and served as a hit to a client with no key at all, and to one with another.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread, running

CALLS = web.AppKey("calls", list)
ACCOUNTS = {"alpha": "alpha's balance is 10", "beta": "beta's balance is 99"}


def _environ(request: web.Request) -> dict[str, str]:
    """The headers as a CGI gateway hands them to its application (the last line wins)."""
    return {"HTTP_" + k.upper().replace("-", "_"): v for k, v in request.headers.items()}


async def _balance(request: web.Request) -> web.Response:
    request.app[CALLS].append(request.path)
    doc = ACCOUNTS.get(_environ(request).get("HTTP_X_API_KEY", ""))
    if doc is None:
        return web.json_response({"error": "no such key"}, status=401)
    return web.json_response({"balance": doc})


def _upstream() -> web.Application:
    app = web.Application()
    app[CALLS] = []
    app.router.add_get("/account/balance", _balance)
    return app


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(_upstream) as server:
        yield server


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("default",)))


def _get(url: str, headers: dict[str, str]) -> tuple[int, str, str]:
    req = urllib.request.Request(url + "/account/balance", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())["balance"], resp.headers["X-Cache"]
    except urllib.error.HTTPError as err:
        with err:
            return err.code, "", err.headers["X-Cache"]


def test_an_underscored_key_header_is_a_credential(
    gw: ServerThread, upstream: ServerThread
) -> None:
    assert _get(gw.url, {"x_api_key": "alpha"}) == (200, "alpha's balance is 10", "miss")
    assert _get(gw.url, {"x_api_key": "alpha"}) == (200, "alpha's balance is 10", "hit")
    # before: (200, "alpha's balance is 10", "hit") for both
    assert _get(gw.url, {}) == (401, "", "miss")
    assert _get(gw.url, {"x_api_key": "beta"}) == (200, "beta's balance is 99", "miss")
    # any mix of the two spellings is the credential header it spells
    assert _get(gw.url, {"X-Api_Key": "beta"}) == (200, "beta's balance is 99", "miss")
    assert upstream.app is not None and len(upstream.app[CALLS]) == 4
