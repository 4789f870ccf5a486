"""The upstream's freshness bounds how long its answer is stored (cache.policy.storable_ttl):
only delta-seconds count (RFC 9111 1.2.2), and a directive given twice counts at its strictest
(4.2.1: the first occurrence, or the answer is stale). Before, `max-age=0, max-age=600` was kept
for 600 s (the last one won), and float() read `max-age=inf` as no bound at all."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from cache.policy import storable_ttl
from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread


@pytest.mark.parametrize(
    ("lines", "ttl"),
    [
        (["max-age=120"], 120.0),
        (["max-age=0, max-age=600"], 0.0),
        (["max-age=600, max-age=0"], 0.0),
        (["max-age=600", "max-age=30"], 30.0),
        (["s-maxage=30, s-maxage=600", "max-age=900"], 30.0),
        (["max-age=inf"], 0.0),
        (["max-age=infinity"], 0.0),
        (["max-age=1e9"], 0.0),
        (["max-age=1_000"], 0.0),
        (['max-age="120"'], 120.0),  # the quoted form a recipient may meet
        (["s-maxage=-5, max-age=600"], 0.0),
    ],
)
def test_the_upstreams_max_age(lines: list[str], ttl: float) -> None:
    headers = [("Cache-Control", v) for v in lines]
    assert storable_ttl(200, headers, 3600.0, now=0.0)[0] == ttl


async def test_a_max_age_given_twice_is_not_stored_past_its_first(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Over HTTP: the test upstream's answer says `max-age=0, max-age=600`; it is not replayed."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    seen = []
    for _ in range(2):
        headers = {"X-Test-Cache-Control": "max-age=0, max-age=600"}
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/twice", headers=headers) as r:
            seen.append((r.status, r.headers.get("X-Cache")))
    assert seen == [(200, "miss"), (200, "miss")]
