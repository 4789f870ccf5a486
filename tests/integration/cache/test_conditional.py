"""Ranges and preconditions on a cached route: a 206 or a 304 answers one request's own Range or
If-None-Match, so such requests neither read nor fill the cache (but an If-None-Match the stored
entry answers: test_revalidation.py), and no other client (a waiter of the same flight included)
ever gets that answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread
from tests.support.upstream import DOCUMENT, DOCUMENT_ETAG

DOC = "/_test/doc"


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes, str]:
    async with aiohttp.ClientSession() as s, s.get(url + DOC, headers=headers or {}) as r:
        body = await r.read()
        return (
            r.status,
            r.headers.get("X-Cache", ""),
            body,
            r.headers.get("X-Cache-Bypass-Reason", ""),
        )


async def test_a_range_or_a_precondition_neither_reads_nor_fills_the_cache(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    part = await _get(gw.url, {"Range": "bytes=0-9"})
    assert part == (206, "bypass", DOCUMENT[:10], "conditional")
    # the plain GET after it is a miss for the whole document, then a hit for it
    assert (await _get(gw.url))[:3] == (200, "miss", DOCUMENT)
    assert (await _get(gw.url))[:3] == (200, "hit", DOCUMENT)
    # with the whole document cached, a Range and an If-Match still go to the replica (an
    # If-None-Match is answered from the entry: tests/integration/cache/test_revalidation.py)
    assert (await _get(gw.url, {"Range": "bytes=10-19"}))[:3] == (206, "bypass", DOCUMENT[10:20])
    assert (await _get(gw.url, {"If-Match": DOCUMENT_ETAG}))[:3] == (200, "bypass", DOCUMENT)
    assert (await _get(gw.url))[:3] == (200, "hit", DOCUMENT)


async def test_a_206_the_replica_sends_unasked_is_not_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    status, x_cache, _, _ = await _get(gw.url, {"X-Test-Status": "206"})
    assert (status, x_cache) == (206, "miss")
    assert (await _get(gw.url))[:3] == (200, "miss", DOCUMENT)  # not the stored partial answer


async def test_a_waiter_never_gets_another_clients_304(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    conditional = asyncio.create_task(
        _get(gw.url, {"If-None-Match": DOCUMENT_ETAG, "X-Test-Delay": "0.5"})
    )
    await asyncio.sleep(0.1)  # the conditional request is with the replica
    plain = await _get(gw.url)
    assert plain[:3] == (200, "miss", DOCUMENT)
    assert (await conditional)[0] == 304


async def test_a_waiter_never_gets_an_answer_chosen_for_another_clients_header(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The replica's answer Varies on Accept-Language, which the key does not hold: it is
    neither stored nor handed to a waiter of the same flight that asked in another language."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))

    async def ask(lang: str, delay: str) -> tuple[str, str]:
        headers = {"Accept-Language": lang, "X-Test-Vary": "Accept-Language", "X-Test-Delay": delay}
        async with aiohttp.ClientSession() as s, s.get(gw.url + DOC, headers=headers) as r:
            await r.read()
            return r.headers.get("X-Varied-Value", ""), r.headers.get("X-Cache", "")

    german = asyncio.create_task(ask("de", "0.5"))
    await asyncio.sleep(0.1)  # the German request is with the replica
    assert (await ask("fr", "0"))[0] == "fr"
    assert (await german)[0] == "de"
    assert await ask("fr", "0") == ("fr", "miss")  # and nothing was stored


async def test_a_head_request_says_the_length_and_stores_nothing(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """A HEAD answer has no body to store: it is not cached (a stored one answered later GETs
    with nothing), and it does not disturb the GET's entry; once the GET is stored, a HEAD is
    answered from it with the GET's length (tests/integration/cache/test_head.py)."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    for head_cache, expected in (("bypass", "miss"), ("hit", "hit")):
        async with aiohttp.ClientSession() as s:
            async with s.head(gw.url + DOC) as r:
                head = r.status, r.headers.get("X-Cache"), r.headers.get("Content-Length")
            async with s.get(gw.url + DOC) as r:
                assert (r.status, r.headers["X-Cache"], await r.read()) == (200, expected, DOCUMENT)
        assert head == (200, head_cache, str(len(DOCUMENT)))
