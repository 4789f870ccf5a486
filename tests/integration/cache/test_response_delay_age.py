"""An answer's age counts the time it took to arrive (RFC 9111 4.2.3: corrected_age_value =
age_value + response_delay): the upstream's Age may have been taken as the request reached it.
Before, an entry's age started at the Age as sent: an answer that said Age: 100 after a 1 s wait
was served as 100 s old, and one whose max-age that second used up was stored as still fresh.

No timing thresholds: the upstream waits at least 1 s, so the corrected age is at least 101."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread


async def _post(url: str, text: str, stream: bool, headers: dict[str, str]) -> dict[str, str]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "stream": stream,
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        await r.read()
        assert r.status == 200
        return dict(r.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_hits_age_counts_the_upstreams_response_delay(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], stream: bool
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    slow = {"X-Test-Age": "100", "X-Test-Delay": "1"}  # 100 s old when sent, 1 s on the way
    miss = await _post(gw.url, "how old", stream, slow)
    assert miss["X-Cache"] == "miss"
    hit = await _post(gw.url, "how old", stream, {})
    assert hit["X-Cache"] == "hit" and int(hit["Age"]) >= 101


async def test_an_answer_whose_freshness_ran_out_on_the_way_is_not_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """max-age=101 and Age: 100, after a wait of at least 1 s: no freshness left on arrival."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    slow = {"X-Test-Age": "100", "X-Test-Delay": "1", "X-Test-Cache-Control": "max-age=101"}
    assert (await _post(gw.url, "used up", False, slow))["X-Cache"] == "miss"
    assert (await _post(gw.url, "used up", False, {}))["X-Cache"] == "miss"
