"""An identical request that arrives while a private answer streams goes upstream at once.

A streamed answer that is not shared (Set-Cookie, Cache-Control: private or no-store) could
never serve the flight's waiters, yet they waited for its last byte before fetching their
own: the second client's first token came after the first client's last, and the wait ate its
route budget (here it was cut by the total timeout). Answers in one body released the waiters
at once already; a stream now does too, when its headers say it will not be shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.test_stream_followers import Read, calls, chat, read_stream
from tests.support.servers import RedisServer, ServerThread


@pytest.mark.parametrize(
    "private",
    [
        {"X-Test-Set-Cookie": "session=1"},
        {"X-Test-Cache-Control": "private"},
        {"X-Test-Cache-Control": "no-store"},
    ],
    ids=["set-cookie", "private", "no-store"],
)
async def test_a_waiter_on_a_private_stream_fetches_its_own_at_once(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], private: dict[str, str]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    body = chat("mine alone")
    headers = {"X-Test-Event-Delay": "0.25", **private}  # ~9 events over ~2 s
    await _both_whole_and_the_second_not_held(gw.url, gw.url, body, headers)
    assert await calls(upstream) == 2


async def test_a_peer_sidecar_does_not_wait_for_a_private_stream_either(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], redis_server: RedisServer
) -> None:
    """The same across processes: the leader's Redis lease told another sidecar that an answer
    was on its way, and it waited for the lease's release at the private stream's end."""
    cfg = cache_config(upstream.url, redis_server.url)
    leader, peer = start_gateway(cfg), start_gateway(cfg)
    body = chat("mine alone, across sidecars")
    headers = {"X-Test-Event-Delay": "0.25", "X-Test-Cache-Control": "private"}
    await _both_whole_and_the_second_not_held(leader.url, peer.url, body, headers)
    assert await calls(upstream) == 2


async def _both_whole_and_the_second_not_held(
    first_url: str, second_url: str, body: dict[str, object], headers: dict[str, str]
) -> None:
    """The same private stream asked at first_url, then at second_url while it streams: both
    get a whole answer, the second its own, begun while the first was still streaming
    (before: after its end)."""
    first, second = Read(), Read()
    async with aiohttp.ClientSession() as s:
        leading = asyncio.create_task(read_stream(s, first_url, body, headers, first))
        await asyncio.wait_for(first.first.wait(), 10)
        await read_stream(s, second_url, body, headers, second)
        await leading
    for got in (first, second):
        assert got.status == 200 and not got.cut
        assert got.body.rstrip().endswith(b"data: [DONE]")
    assert second.times[0] < first.times[-1]
