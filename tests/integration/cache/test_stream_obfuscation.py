"""OpenAI's stream obfuscation padding on stored streams (`stream_options.include_obfuscation`).

OpenAI pads each stream chunk with a random `obfuscation` string so that whoever watches the
wire cannot read the answer's tokens off the chunks' sizes; a client may turn it off. A stored
stream was replayed as recorded: a client that asked for no padding got the leader's anyway,
and every hit had the same padding, so anyone who asked the question once knew the exact size
of each chunk of everyone else's answer to it. Now each replay draws its own padding, a client
that refused it gets none, and a stream recorded without padding is replayed without any.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import until, upstream_calls
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

CHAT = "/v1/chat/completions"
PADDED = {"X-Test-Obfuscation": "1"}  # the test upstream pads, as OpenAI does


def _streamed(
    url: str, text: str, slow: bool = False, **options: bool
) -> tuple[str, str, list[str | None]]:
    """X-Cache, the answer's text and each chunk's padding, as the SDK reads them."""
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model="m",
        temperature=0,
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options=dict(options) if options else None,  # type: ignore[arg-type]
        extra_headers={**PADDED, **({"X-Test-Event-Delay": "0.2"} if slow else {})},
    )
    chunks: list[Any] = list(raw.parse())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return raw.headers.get("X-Cache", ""), content, [c.obfuscation for c in chunks]


def test_each_replay_of_a_padded_stream_gets_fresh_padding_or_none_when_refused(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    text = "pad me please with several words"
    x_cache, content, recorded = _streamed(gw.url, text)
    assert x_cache == "miss" and all(recorded)
    first_hit = _streamed(gw.url, text)
    second_hit = _streamed(gw.url, text)
    for x_cache, got, padding in (first_hit, second_hit):
        assert (x_cache, got) == ("hit", content)
        assert all(padding) and len(padding) == len(recorded)
        assert all(p.isalnum() for p in padding if p)
    # new padding, not the recorded one, and not the same on two replays
    assert first_hit[2] != recorded and second_hit[2] != first_hit[2]
    refused = _streamed(gw.url, text, include_obfuscation=False)
    assert refused == ("hit", content, [None] * len(recorded))


def test_a_stream_recorded_without_padding_is_replayed_without_any(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    text = "no padding here"
    x_cache, content, recorded = _streamed(gw.url, text, include_obfuscation=False)
    assert x_cache == "miss" and not any(recorded)
    for options in ({}, {"include_obfuscation": True}, {"include_obfuscation": False}):
        assert _streamed(gw.url, text, **options) == ("hit", content, recorded)


def test_a_stream_that_refused_padding_does_not_follow_a_padded_leader_live(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """It waits for the leader's whole answer (one upstream call still) and gets it unpadded;
    a follower that did not refuse padding follows live, as before."""
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    text = "a padded leader and two followers"
    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(_streamed, gw.url, text, True)
        # the leader is upstream (its ~8 events come 0.2 s apart): not a fixed sleep, which a
        # loaded machine's late leader outlasts (the refusing call then leads, unpadded)
        until(lambda: upstream_calls(upstream, CHAT) == 1, "the leader's call went upstream")
        refused = pool.submit(_streamed, gw.url, text, True, include_obfuscation=False)
        padded = pool.submit(_streamed, gw.url, text, True)
        leader_got, refused_got, padded_got = leader.result(), refused.result(), padded.result()
    assert leader_got[0] == "miss" and all(leader_got[2])
    assert refused_got[1] == leader_got[1] and not any(refused_got[2])
    assert padded_got[1] == leader_got[1] and all(padded_got[2])
    assert upstream_calls(upstream, CHAT) == 1
