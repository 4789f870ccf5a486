"""A conditional GET or HEAD whose only precondition is If-None-Match is answered from the stored
entry (RFC 9111 4.3.2, RFC 9110 13.1.2): a 304 when it names the entry's ETag (weak comparison,
`*`, or one of a list), the entry itself when it names another tag; the replica is not asked.
Before, every revalidation went upstream (`X-Cache: bypass`, reason `conditional`): a client
that revalidates what it holds (a browser, an HTTP cache library) cost a replica call each time.
Without a stored entry, or with other preconditions, it still goes upstream."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from multidict import CIMultiDict

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import ALICE, BOB
from tests.support.servers import ServerThread
from tests.support.upstream import DOCUMENT, DOCUMENT_ETAG
from tests.support.upstream_base import stats

DOC = "/_test/doc"


def _calls(upstream: ServerThread) -> int:
    assert upstream.app is not None
    return int(stats(upstream.app)["requests"].get(DOC, 0))


async def _ask(
    s: aiohttp.ClientSession, url: str, method: str = "GET", auth: str = ALICE, **headers: str
) -> tuple[int, str, bytes, CIMultiDict[str]]:
    async with s.request(method, url + DOC, headers={"Authorization": auth, **headers}) as r:
        return r.status, r.headers.get("X-Cache", ""), await r.read(), CIMultiDict(r.headers)


async def test_if_none_match_is_answered_from_the_stored_entry(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("default",)))
    async with aiohttp.ClientSession() as s:
        assert (await _ask(s, gw.url))[:3] == (200, "miss", DOCUMENT)
        calls = _calls(upstream)
        for tags in (DOCUMENT_ETAG, f"W/{DOCUMENT_ETAG}", f'"other", {DOCUMENT_ETAG}', "*"):
            for method in ("GET", "HEAD"):
                status, x_cache, body, headers = await _ask(
                    s, gw.url, method, **{"If-None-Match": tags}
                )
                assert (status, x_cache, body) == (304, "hit", b""), (tags, method)
                assert headers["ETag"] == DOCUMENT_ETAG and "Age" in headers
        # a tag the entry does not have: the condition holds, the entry is the answer
        other = await _ask(s, gw.url, **{"If-None-Match": '"doc-v0"'})
        assert other[:3] == (200, "hit", DOCUMENT)
        # If-Modified-Since is ignored beside If-None-Match (RFC 9110 13.1.3)
        both = {
            "If-None-Match": DOCUMENT_ETAG,
            "If-Modified-Since": "Thu, 01 Jan 2015 00:00:00 GMT",
        }
        assert (await _ask(s, gw.url, **both))[:2] == (304, "hit")
        assert _calls(upstream) == calls  # none of these asked the replica


async def test_if_none_match_goes_upstream_when_the_entry_cannot_answer_it(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("default",)))
    inm = {"If-None-Match": DOCUMENT_ETAG}
    async with aiohttp.ClientSession() as s:
        # nothing stored: the replica's own 304, and nothing stored from it
        assert (await _ask(s, gw.url, **inm))[:2] == (304, "bypass")
        assert (await _ask(s, gw.url))[:2] == (200, "miss")
        calls = _calls(upstream)
        # another tenant's stored entry does not answer bob's revalidation
        assert (await _ask(s, gw.url, auth=BOB, **inm))[:2] == (304, "bypass")
        # nor does it answer one that refuses stored answers, or has another precondition
        assert (await _ask(s, gw.url, **inm, **{"Cache-Control": "no-cache"}))[:2] == (
            304,
            "bypass",
        )
        ranged = await _ask(s, gw.url, **inm, Range="bytes=0-9")
        assert ranged[:2] == (304, "bypass")
        assert _calls(upstream) == calls + 3
