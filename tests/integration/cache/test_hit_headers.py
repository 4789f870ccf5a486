"""What a hit tells the client of the upstream: the answer's own fields, not the exchange that
fetched it. Before, every hit replayed the miss's `x-request-id` (the OpenAI SDK's
`_request_id`, quoted in support tickets), its `openai-processing-ms`, `cf-ray` and
`x-envoy-upstream-service-time`, and the rate limit left after it (`x-ratelimit-remaining-*`,
`anthropic-ratelimit-*`), which clients throttle on: frozen at the miss, for the entry's life."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from cache.codec import decode, encode
from tests.fault.conftest import metric
from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import RedisServer, ServerThread

VENDOR = {"X-Test-Vendor-Headers": "1"}
# one exchange's facts: never on a hit
EXCHANGE = (
    "x-request-id",
    "request-id",
    "cf-ray",
    "openai-processing-ms",
    "x-envoy-upstream-service-time",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "anthropic-ratelimit-requests-remaining",
)
# the answer's own: on every hit as on the miss
ANSWER = {"openai-model": "gpt-test-2025", "openai-organization": "org-test"}


def _call(url: str, stream: bool, text: str = "two plus two") -> tuple[Any, dict[str, str]]:
    """One chat call through the OpenAI SDK: the request id it reports, and the headers."""
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        temperature=0,
        stream=stream,
        extra_headers=VENDOR,
    )
    parsed = raw.parse()
    if stream:
        list(parsed)
        request_id = raw.request_id
    else:
        request_id = parsed._request_id  # what the SDK hands a caller for a support ticket
    return request_id, {k.lower(): v for k, v in raw.headers.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_hits_carry_no_request_id_timing_or_rate_limit_of_the_miss(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], stream: bool
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    miss_id, miss = _call(gw.url, stream)
    assert miss["x-cache"] == "miss" and miss_id == miss["x-request-id"]  # the upstream's
    assert miss["x-ratelimit-remaining-requests"].isdigit()
    for _ in range(2):
        hit_id, hit = _call(gw.url, stream)
        assert hit["x-cache"] == "hit"
        assert hit_id is None, "a hit has no upstream request to name"
        assert [h for h in EXCHANGE if h in hit] == []
        assert {k: hit.get(k) for k in ANSWER} == ANSWER


async def test_a_waiter_and_a_follower_are_not_given_the_leaders_request_id(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """An identical request that waited on the leader's flight (one body) or followed its
    stream live was sent the leader's upstream answer whole, ids and rate limit included."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))

    async def post(s: aiohttp.ClientSession, stream: bool, slow: dict[str, str]) -> dict[str, str]:
        # (another question for each: a stored body would answer the stream as a hit)
        text = f"two plus two, stream={stream}"
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}
        body["stream"] = stream
        async with s.post(
            gw.url + "/v1/chat/completions", json=body, headers={**VENDOR, **slow}
        ) as r:
            await r.read()
            return {k.lower(): v for k, v in r.headers.items()}

    for stream, slow in (
        (False, {"X-Test-Delay": "1"}),
        (True, {"X-Test-Delay": "1", "X-Test-Event-Delay": "0.1"}),
    ):
        async with aiohttp.ClientSession() as s:
            leader = asyncio.create_task(post(s, stream, slow))
            await asyncio.sleep(0.3)  # the leader is upstream: the other joins its flight
            other = await post(s, stream, slow)
            first = await leader
        assert "x-request-id" in first, stream
        assert [h for h in EXCHANGE if h in other] == [], stream
        async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
            calls = (await r.json())["requests"]["/v1/chat/completions"]
        assert calls == (1 if not stream else 2)  # one upstream call each time
    coalesced = "latentgate_cache_singleflight_coalesced_total"
    assert await metric(gw.url, coalesced, outcome="followed") == 1  # the stream, live


async def test_entries_stored_with_them_do_not_replay_them(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    redis_server: RedisServer,
) -> None:
    """Entries an earlier version stored in Redis still hold the upstream's id and rate limit:
    a hit on one (here from a second sidecar, whose memory is empty) does not send them."""
    config = cache_config(upstream.url, redis_server.url)
    prefix = config["cache"]["redis"]["key_prefix"] + "e:"
    first = start_gateway(config)
    await asyncio.to_thread(_call, first.url, False)
    admin = Redis.from_url(redis_server.url)
    try:
        keys = [k async for k in admin.scan_iter(match=prefix + "*")]
        assert len(keys) == 1
        entry = decode(await admin.get(keys[0]))
        entry.headers += [("x-request-id", "req_stored"), ("x-ratelimit-remaining-requests", "9")]
        await admin.set(keys[0], encode(entry), keepttl=True)
    finally:
        await admin.aclose()
    second = start_gateway(config)
    request_id, hit = await asyncio.to_thread(_call, second.url, False)
    assert hit["x-cache"] == "hit" and request_id is None
    assert "x-ratelimit-remaining-requests" not in hit
    assert {k: hit.get(k) for k in ANSWER} == ANSWER


async def test_a_stored_stream_with_usage_on_every_chunk_does_not_replay_them(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    redis_server: RedisServer,
) -> None:
    """As above, for a call asking vLLM's usage on every chunk, whose entry is replayed as it
    was recorded (render.py's own branch for it)."""
    config = cache_config(upstream.url, redis_server.url)
    prefix = config["cache"]["redis"]["key_prefix"] + "e:"
    every: Any = {"include_usage": True, "continuous_usage_stats": True}  # (vLLM's own option)

    def streamed(url: str) -> dict[str, str]:
        raw = openai_client(url).chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": "usage as it goes"}],
            temperature=0,
            stream=True,
            stream_options=every,
            extra_headers=VENDOR,
        )
        list(raw.parse())
        return {k.lower(): v for k, v in raw.headers.items()}

    first = start_gateway(config)
    assert (await asyncio.to_thread(streamed, first.url))["x-cache"] == "miss"
    admin = Redis.from_url(redis_server.url)
    try:
        keys = [k async for k in admin.scan_iter(match=prefix + "*")]
        assert len(keys) == 1
        entry = decode(await admin.get(keys[0]))
        assert entry.events is not None  # (a recorded stream)
        entry.headers += [("x-request-id", "req_stored"), ("x-ratelimit-remaining-requests", "9")]
        await admin.set(keys[0], encode(entry), keepttl=True)
    finally:
        await admin.aclose()
    hit = await asyncio.to_thread(streamed, start_gateway(config).url)
    assert hit["x-cache"] == "hit"
    assert "x-request-id" not in hit and "x-ratelimit-remaining-requests" not in hit
