"""A HEAD answered from the stored GET of its target (RFC 9111 4, RFC 9110 9.3.2): the GET's
status and header fields, its length, no body, no upstream call; for that tenant only, under
the HEAD's own Cache-Control, and never after the GET's entry is gone. Before, every HEAD went
upstream (`X-Cache: bypass`, reason `head`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import aiohttp

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import ALICE, BOB
from tests.support.servers import ServerThread
from tests.support.upstream_base import stats


async def _ask(
    s: aiohttp.ClientSession, method: str, url: str, auth: str = ALICE, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with s.request(method, url, headers={"Authorization": auth, **headers}) as r:
        return r.status, dict(r.headers), await r.read()


def _calls(upstream: ServerThread, path: str) -> int:
    assert upstream.app is not None
    return int(stats(upstream.app)["requests"].get(path, 0))


async def test_a_head_is_answered_from_the_stored_get_for_that_tenant_alone(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("default",)))
    path = f"/items/{uuid.uuid4().hex[:8]}"
    url = gw.url + path
    async with aiohttp.ClientSession() as s:
        status, first, body = await _ask(s, "GET", url)
        assert (status, first["X-Cache"]) == (200, "miss")
        calls = _calls(upstream, path)
        status, head, empty = await _ask(s, "HEAD", url)
        assert (status, head["X-Cache"], empty) == (200, "hit", b"")
        assert head["Content-Length"] == str(len(body))  # the GET's length
        assert head["Content-Type"] == first["Content-Type"] and "Age" in head
        assert _calls(upstream, path) == calls  # no upstream call
        # bob has no stored GET of it: his HEAD goes upstream, and stores nothing
        status, bobs, _ = await _ask(s, "HEAD", url, auth=BOB)
        assert (status, bobs["X-Cache"], bobs["X-Cache-Bypass-Reason"]) == (200, "bypass", "head")
        assert (await _ask(s, "GET", url, auth=BOB))[1]["X-Cache"] == "miss"
        # the HEAD's own Cache-Control and preconditions hold
        no_cache = await _ask(s, "HEAD", url, **{"Cache-Control": "no-cache"})
        assert no_cache[1]["X-Cache"] == "bypass"
        etag = await _ask(s, "HEAD", url, **{"If-Match": '"x"'})
        assert etag[1]["X-Cache-Bypass-Reason"] == "conditional"
        calls = _calls(upstream, path)
        # a DELETE of the target drops the GET: the next HEAD goes upstream
        assert (await _ask(s, "DELETE", url))[0] == 200
        assert (await _ask(s, "HEAD", url))[1]["X-Cache"] == "bypass"
        assert _calls(upstream, path) == calls + 2
        # only-if-cached with nothing stored: a 504, as for a GET
        missing = gw.url + f"/items/{uuid.uuid4().hex[:8]}"
        status, _, _ = await _ask(s, "HEAD", missing, **{"Cache-Control": "only-if-cached"})
        assert status == 504
