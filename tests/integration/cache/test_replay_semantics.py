"""What is replayed: only determined calls by default, the upstream's freshness, one encoding for
every client, never a cookie, and usage as each client's stream_options asks.

Through the real gateway with the real OpenAI SDK, and raw HTTP where headers are the point.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Callable

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running

MESSAGES = [{"role": "user", "content": "replay rules"}]


async def _calls(upstream: ServerThread, path: str = "/v1/chat/completions") -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get(path, 0))


async def _post(
    url: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers or {}) as r,
    ):
        return r.status, dict(r.headers), await r.read()


async def test_sampled_calls_are_not_replayed_and_say_why(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    raws = [
        openai_client(gw.url).chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, temperature=0.7
        )
        for _ in range(2)
    ]
    assert [r.headers["X-Cache"] for r in raws] == ["bypass", "bypass"]
    assert [r.headers["X-Cache-Bypass-Reason"] for r in raws] == ["sampled", "sampled"]
    assert await _calls(upstream) == 2
    # a seed or temperature 0 determines the answer: replayed
    for extra in ({"seed": 7}, {"temperature": 0}):
        xs = [
            openai_client(gw.url)
            .chat.completions.with_raw_response.create(model="m", messages=MESSAGES, **extra)
            .headers["X-Cache"]
            for _ in range(2)
        ]
        assert xs == ["miss", "hit"], extra
    # a seed or a zero that is not the integer / number the API defines: sampled, not replayed
    for odd in ({"seed": "7"}, {"seed": True}, {"temperature": False}, {"temperature": "0"}):
        xs = [
            openai_client(gw.url)
            .chat.completions.with_raw_response.create(model="m", messages=MESSAGES, extra_body=odd)
            .headers["X-Cache"]
            for _ in range(2)
        ]
        assert xs == ["bypass", "bypass"], odd


async def test_only_deterministic_false_replays_sampled_calls(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], only_deterministic=False))
    xs = [
        openai_client(gw.url)
        .chat.completions.with_raw_response.create(model="m", messages=MESSAGES, temperature=0.7)
        .headers["X-Cache"]
        for _ in range(2)
    ]
    assert xs == ["miss", "hit"]


@pytest.mark.parametrize(
    "directive",
    ["max-age=1", "no-cache", "s-maxage=0, max-age=600", "private", "no-store"],
)
async def test_upstream_freshness_bounds_what_is_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], directive: str
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    body = {"model": "m", "messages": MESSAGES, "temperature": 0}
    hdrs = {"X-Test-Cache-Control": directive}
    xs = [(await _post(gw.url, body, hdrs))[1]["X-Cache"] for _ in range(2)]
    if directive == "max-age=1":
        assert xs == ["miss", "hit"]  # fresh for one second ...
        await asyncio.sleep(1.6)
        assert (await _post(gw.url, body, hdrs))[1]["X-Cache"] == "miss"  # ... then not
    else:
        assert xs == ["miss", "miss"]


async def test_past_expires_and_vary_on_an_unkeyed_header_are_not_stored(
    start_gateway: Callable[..., ServerThread],
) -> None:
    async def chat(request: web.Request) -> web.Response:
        mode = request.headers.get("X-Mode", "")
        headers = {
            "expires": {"Expires": "Thu, 01 Jan 2015 00:00:00 GMT"},
            "vary": {"Vary": "X-Mode"},
            "vary-ae": {"Vary": "Accept-Encoding"},
        }[mode]
        doc = {"object": "chat.completion", "choices": [], "usage": {"total_tokens": 1}}
        return web.json_response(doc, headers=headers)

    with running(one_route("/v1/chat/completions", chat)) as up:
        gw = start_gateway(cache_config(up.url, tiers=["memory"]))
        for mode, expected in (("expires", "miss"), ("vary", "miss"), ("vary-ae", "hit")):
            body = {"model": mode, "messages": MESSAGES, "temperature": 0}
            xs = [(await _post(gw.url, body, {"X-Mode": mode}))[1]["X-Cache"] for _ in range(2)]
            assert xs == ["miss", expected], mode


async def test_one_stored_encoding_serves_every_client(
    start_gateway: Callable[..., ServerThread],
) -> None:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding", ""))
        raw = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(
                body=gzip.compress(raw),
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
        return web.Response(body=raw, content_type="application/json")

    with running(one_route("/v1/chat/completions", chat)) as up:
        gw = start_gateway(cache_config(up.url, tiers=["memory"]))
        body = {"model": "m", "messages": MESSAGES, "temperature": 0}
        _, h1, b1 = await _post(gw.url, body, {"Accept-Encoding": "gzip"})
        _, h2, b2 = await _post(gw.url, body, {"Accept-Encoding": "identity"})
        assert (h1["X-Cache"], h2["X-Cache"]) == ("miss", "hit")
        assert seen == ["identity"]  # the gateway asked for what every client can take
        assert "Content-Encoding" not in h2 and json.loads(b2)["object"] == "chat.completion"
        assert b1 == b2


async def test_set_cookie_reaches_the_client_and_is_never_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    body = {"model": "m", "messages": MESSAGES, "temperature": 0}
    first = await _post(gw.url, body, {"X-Test-Set-Cookie": "session=alice"})
    second = await _post(gw.url, body)
    assert first[1]["Set-Cookie"] == "session=alice" and first[1]["X-Cache"] == "miss"
    assert second[1]["X-Cache"] == "miss" and "Set-Cookie" not in second[1]
    assert await _calls(upstream) == 2


def test_usage_on_replay_follows_each_clients_stream_options(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    client = openai_client(gw.url)
    kwargs: dict[str, object] = {"model": "m", "messages": MESSAGES, "temperature": 0}
    # stored with its usage chunk ...
    with_usage = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    # ... replayed without it to a client that did not ask: the SDK's usual loop works
    raw = client.chat.completions.with_raw_response.create(**kwargs, stream=True)
    assert raw.headers["X-Cache"] == "hit"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse())
    assert text == "echo(up): replay rules"
    # an entry without usage cannot answer a client that asks for it: a miss completes it
    other: dict[str, object] = {**kwargs, "messages": [{"role": "user", "content": "usage?"}]}
    list(client.chat.completions.create(**other, stream=True))
    xs = []
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            **other, stream=True, stream_options={"include_usage": True}
        )
        xs.append(raw.headers["X-Cache"])
        assert list(raw.parse())[-1].usage is not None
    assert xs == ["miss", "hit"]


async def test_the_byte_alias_shortcut_applies_the_usage_rule_too(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    base = {"model": "m", "messages": MESSAGES, "temperature": 0, "stream": True}
    wants_usage = {**base, "stream_options": {"include_usage": True}}
    assert (await _post(gw.url, wants_usage))[1]["X-Cache"] == "miss"  # its bytes remembered
    # another client re-fetches (no-cache) and stores the same key's answer without usage
    status, headers, _ = await _post(gw.url, base, {"Cache-Control": "no-cache"})
    assert (status, headers["X-Cache"]) == (200, "bypass")
    # the first client's very bytes again: not served an entry that lacks its usage chunk
    status, headers, body = await _post(gw.url, wants_usage)
    assert (status, headers["X-Cache"]) == (200, "miss")
    assert b'"choices": [], "usage"' in body or b'"choices":[],"usage"' in body


def test_stream_null_is_a_plain_call(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The API's `stream` is nullable (null: not streamed), and the SDK sends `stream=None` as
    null: an answer, never a 400 the upstream would not give; it shares `stream: false`'s entry."""
    c = openai_client(start_gateway(cache_config(upstream.url, tiers=["memory"])).url)
    kw = {"model": "m", "messages": MESSAGES, "temperature": 0}
    first = c.chat.completions.with_raw_response.create(**kw, stream=None)  # type: ignore[call-overload]
    again = c.chat.completions.with_raw_response.create(**kw, stream=False)
    assert (first.headers["X-Cache"], again.headers["X-Cache"]) == ("miss", "hit")
    assert first.parse().choices[0].message.content == "echo(up): replay rules"
    assert again.parse().model_dump() == first.parse().model_dump()
    text = c.completions.create(model="m", prompt="p", temperature=0, stream=None)  # type: ignore[call-overload]
    assert text.choices[0].text == "echo(up): p"


def test_stream_options_without_a_stream_is_the_upstreams_400_cold_and_warm(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """OpenAI and vLLM refuse stream_options on a call that does not stream. The key leaves
    stream_options out only for a streamed call (where it is framing): before, such a call
    shared the plain call's entry and was a 200 hit once that was stored, a 400 cold."""
    c = openai_client(start_gateway(cache_config(upstream.url, tiers=["memory"])).url)
    kw = {"model": "m", "messages": MESSAGES, "temperature": 0}
    usage = {"include_usage": True}
    with pytest.raises(openai.BadRequestError, match="only allowed when 'stream'"):
        c.chat.completions.create(**kw, stream_options=usage)  # type: ignore[call-overload]
    assert c.chat.completions.with_raw_response.create(**kw).headers["X-Cache"] == "miss"
    with pytest.raises(openai.BadRequestError, match="only allowed when 'stream'"):
        c.chat.completions.create(**kw, stream=False, stream_options=usage)  # type: ignore[call-overload]
    # streamed, it is framing: the stored answer serves it, with its usage chunk
    raw = c.chat.completions.with_raw_response.create(**kw, stream=True, stream_options=usage)
    assert raw.headers["X-Cache"] == "hit"
    assert [chunk for chunk in raw.parse()][-1].usage is not None


def test_stream_options_the_api_refuses_are_its_400_on_a_streamed_call_too(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """On a streamed call stream_options is framing only when it is the API's (booleans):
    {"include_usage": "yes"} is a 400 cold, and was a 200 hit once a streamed call was stored."""
    c = openai_client(start_gateway(cache_config(upstream.url, tiers=["memory"])).url)
    kw = {"model": "m", "messages": MESSAGES, "temperature": 0, "stream": True}
    bad = {"include_usage": "yes"}
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        c.chat.completions.create(**kw, stream_options=bad)  # type: ignore[call-overload]
    good = {"include_usage": True}
    raw = c.chat.completions.with_raw_response.create(**kw, stream_options=good)  # type: ignore[call-overload]
    assert raw.headers["X-Cache"] == "miss"
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        c.chat.completions.create(**kw, stream_options=bad)  # type: ignore[call-overload]
