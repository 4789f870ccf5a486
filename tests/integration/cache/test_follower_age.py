"""A follower of a live stream says the answer's Age, as a flight's waiter and a hit of it do.

The follower's copy was not made for its request (RFC 9111 5.1: the Age field says so). It was
sent the leader's header fields as they came: no Age at all for an answer made as it was sent
(a waiter and a hit say Age: 0), and an upstream cache's Age without the response delay.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import until, upstream_calls
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

CHAT = "/v1/chat/completions"


def _streamed(url: str, text: str, upstream_age: str | None) -> tuple[str, int]:
    """X-Cache and Age (-1 when absent), the stream read to its end by the SDK."""
    headers = {
        "X-Test-Event-Delay": "0.2",
        **({"X-Test-Age": upstream_age} if upstream_age else {}),
    }
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model="m",
        temperature=0,
        messages=[{"role": "user", "content": text}],
        stream=True,
        extra_headers=headers,
    )
    chunks: list[Any] = list(raw.parse())
    assert chunks[-1].choices[0].finish_reason == "stop"
    return raw.headers.get("X-Cache", ""), int(raw.headers.get("Age", "-1"))


@pytest.mark.parametrize("upstream_age", [None, "100"])
def test_a_follower_is_sent_the_answers_age(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], upstream_age: str | None
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    text = f"how old is this answer {upstream_age}"
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(_streamed, gw.url, text, upstream_age)
        # the leader's call is upstream (its stream then takes ~8 events 0.2 s apart): not a
        # fixed sleep, which a loaded machine's late leader outlasts (the follower then leads,
        # and without an upstream Age it says none)
        until(lambda: upstream_calls(upstream, CHAT) == 1, "the leader's call went upstream")
        follower = pool.submit(_streamed, gw.url, text, upstream_age).result()
        leader.result()
    hit = _streamed(gw.url, text, upstream_age)
    assert follower[0] == "miss" and hit[0] == "hit"
    # as the entry's age (its resident time starts at the stream's end): the upstream's Age
    # and the response delay (a second more when the headers took one: a loaded machine), or
    # 0 for an answer made as it was sent; the hit, a moment later, is no younger
    if upstream_age is None:
        assert follower[1] == 0 <= hit[1]
    else:
        assert 100 <= follower[1] <= hit[1]
