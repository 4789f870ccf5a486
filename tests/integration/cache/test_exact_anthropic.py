"""The anthropic SDK through the gateway's default Messages route (exact cache on).

Same answers as the upstream directly, plain and streamed (`messages.stream()`); an exact hit on
a repeat; entries kept apart by API key (x-api-key or Authorization) and by the
anthropic-version / anthropic-beta headers; a stream cut before message_stop never stored; a
stored message replayed as a stream and a stored stream as a message.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import pytest
from anthropic.types import MessageParam

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

MESSAGES: list[MessageParam] = [{"role": "user", "content": "hello there gateway"}]
TEXT = "echo(up): hello there gateway"


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


def client(url: str, key: str = "sk-ant-alice", **kw: Any) -> anthropic.Anthropic:
    return track(anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, **kw))


def create(c: anthropic.Anthropic, **kw: Any) -> tuple[dict[str, Any], str]:
    raw = c.messages.with_raw_response.create(
        model="claude-test", max_tokens=64, messages=MESSAGES, **kw
    )
    return raw.parse().model_dump(), raw.headers.get("X-Cache", "")


def stream(c: anthropic.Anthropic, **kw: Any) -> tuple[str, dict[str, Any], str]:
    with c.messages.stream(model="claude-test", max_tokens=64, messages=MESSAGES, **kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message().model_dump()
        return text, final, s.response.headers.get("X-Cache", "")


def upstream_calls(upstream: ServerThread) -> int:
    with urllib.request.urlopen(upstream.url + "/_test/stats") as r:
        return int(json.load(r)["requests"].get("/v1/messages", 0))


def test_plain_same_as_direct_and_a_hit_on_repeat(upstream: ServerThread, gw: ServerThread) -> None:
    direct, _ = create(client(upstream.url))
    first, x1 = create(client(gw.url))
    again, x2 = create(client(gw.url))
    assert (x1, x2) == ("miss", "hit")
    assert first == again == direct
    assert direct["content"][0]["text"] == TEXT
    assert upstream_calls(upstream) == 2  # direct + the one miss


def test_stream_text_and_final_message_same_as_direct(
    upstream: ServerThread, gw: ServerThread
) -> None:
    direct = stream(client(upstream.url))
    t1, m1, x1 = stream(client(gw.url))
    t2, m2, x2 = stream(client(gw.url))
    assert (x1, x2) == ("miss", "hit")
    assert t1 == t2 == direct[0] == TEXT
    assert m1 == m2 == direct[1]
    assert upstream_calls(upstream) == 2


def test_stored_message_replayed_as_a_stream_and_back(
    upstream: ServerThread, gw: ServerThread
) -> None:
    c = client(gw.url)
    plain, x1 = create(c)
    text, final, x2 = stream(c)
    assert (x1, x2) == ("miss", "hit")
    assert text == TEXT and final == plain
    # and a stored stream served to a plain client
    streamed = stream(c, system="be brief")
    as_json, x3 = create(c, system="be brief")
    assert (streamed[2], x3) == ("miss", "hit")
    assert as_json == streamed[1] == create(client(upstream.url), system="be brief")[0]
    assert upstream_calls(upstream) == 3


def test_tool_use_input_survives_both_conversions(upstream: ServerThread, gw: ServerThread) -> None:
    tools: Any = [{"name": "lookup", "input_schema": {"type": "object"}}]
    kw: dict[str, Any] = {"tools": tools, "tool_choice": {"type": "tool", "name": "lookup"}}
    c = client(gw.url)
    plain, _ = create(c, **kw)
    _, final, x = stream(c, **kw)
    assert x == "hit" and final == plain
    assert plain["content"][0]["input"] == {"echo": TEXT}
    assert plain["stop_reason"] == "tool_use"


def test_another_api_key_is_not_served_the_first_keys_entry(
    upstream: ServerThread, gw: ServerThread
) -> None:
    assert create(client(gw.url, "sk-ant-alice"))[1] == "miss"
    assert create(client(gw.url, "sk-ant-bob"))[1] == "miss"
    assert create(client(gw.url, "sk-ant-bob"))[1] == "hit"
    # the same through Authorization: Bearer (the SDK's auth_token)
    bearer_a = track(anthropic.Anthropic(base_url=gw.url, auth_token="tok-a", max_retries=0))
    bearer_b = track(anthropic.Anthropic(base_url=gw.url, auth_token="tok-b", max_retries=0))
    assert create(bearer_a)[1] == "miss"
    assert create(bearer_b)[1] == "miss"
    assert create(bearer_a)[1] == "hit"
    assert upstream_calls(upstream) == 4


def test_version_and_beta_headers_are_part_of_the_key(
    upstream: ServerThread, gw: ServerThread
) -> None:
    c = client(gw.url)
    assert create(c)[1] == "miss"
    # the very same body bytes: only the header differs
    assert create(c, extra_headers={"anthropic-beta": "tools-2024"})[1] == "miss"
    assert create(c, extra_headers={"anthropic-beta": "tools-2024"})[1] == "hit"
    assert create(c, extra_headers={"anthropic-version": "2099-01-01"})[1] == "miss"
    assert create(c)[1] == "hit"
    assert upstream_calls(upstream) == 3


async def test_a_stream_cut_before_message_stop_is_never_stored(
    upstream: ServerThread, gw: ServerThread
) -> None:
    body = {"model": "claude-test", "max_tokens": 64, "messages": MESSAGES, "stream": True}
    headers = {"x-api-key": "sk-ant-alice", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(
                gw.url + "/v1/messages", json=body, headers={**headers, "X-Test-Cut-Stream": "4"}
            ) as r:
                assert r.headers["X-Cache"] == "miss"
                await r.read()
    text, _, x = stream(client(gw.url))
    assert x == "miss" and text == TEXT
    assert stream(client(gw.url))[2] == "hit"
    assert upstream_calls(upstream) == 2


def test_bad_request_gets_the_anthropic_error_envelope(gw: ServerThread) -> None:
    req = urllib.request.Request(
        gw.url + "/v1/messages",
        data=json.dumps({"model": "claude-test", "messages": MESSAGES}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": "k"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 400
    doc = json.load(info.value)
    info.value.close()  # an HTTPError holds the socket; the traceback keeps it past this test
    assert doc["type"] == "error"
    assert doc["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in doc["error"]["message"]


def test_cache_control_no_cache_skips_the_entry(upstream: ServerThread, gw: ServerThread) -> None:
    c = client(gw.url)
    create(c)
    _, x = create(c, extra_headers={"Cache-Control": "no-cache"})
    assert x == "bypass"
    assert upstream_calls(upstream) == 2


async def test_identical_concurrent_streams_make_one_upstream_call(
    upstream: ServerThread, gw: ServerThread
) -> None:
    c = anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-ant-alice", max_retries=0)

    async def one() -> tuple[str, str]:
        async with c.messages.stream(
            model="claude-test",
            max_tokens=64,
            messages=MESSAGES,
            extra_headers={"X-Test-Event-Delay": "0.02"},  # slow enough for all to overlap
        ) as s:
            text = "".join([t async for t in s.text_stream])
            return text, s.response.headers.get("X-Cache", "")

    results = await asyncio.gather(*(one() for _ in range(6)))
    await c.close()
    assert {text for text, _ in results} == {TEXT}
    assert {x for _, x in results} == {"miss"}  # the leader streamed live, waiters got its entry
    assert upstream_calls(upstream) == 1


def test_upstream_errors_pass_verbatim_and_are_not_stored(
    upstream: ServerThread, gw: ServerThread
) -> None:
    failing = client(gw.url).with_options(default_headers={"X-Test-Status": "529"})
    for _ in range(2):
        with pytest.raises(anthropic.APIStatusError) as info:
            failing.messages.create(model="claude-test", max_tokens=64, messages=MESSAGES)
        assert info.value.status_code == 529
    assert create(client(gw.url))[1] == "miss"
    assert upstream_calls(upstream) == 3


@pytest.mark.parametrize(
    ("content", "system", "param"),
    [
        (["hi"], None, "messages[0].content[0]"),
        ([{"text": "hi"}], None, "messages[0].content[0]"),
        ([{"type": "text"}], None, "messages[0].content[0].text"),
        ([{"type": "text", "text": 5}], None, "messages[0].content[0].text"),
        ("hi", [{"type": "text", "text": None}], "system[0].text"),
        ("hi", ["Be brief."], "system[0]"),
    ],
)
def test_malformed_content_blocks_are_the_sdks_400(
    gw: ServerThread, upstream: ServerThread, content: Any, system: Any, param: str
) -> None:
    """Before, they went upstream as sent; the SDK got whatever it made of them (the test
    upstream's 500 here). The SDK sends such dicts as given: its types are not checked."""
    calls = upstream_calls(upstream)
    kw: dict[str, Any] = {} if system is None else {"system": system}
    with pytest.raises(anthropic.BadRequestError) as err:
        client(gw.url).messages.create(
            model="claude-test",
            max_tokens=64,
            messages=[{"role": "user", "content": content}],
            **kw,
        )
    assert err.value.status_code == 400
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert err.value.body["error"]["message"].startswith(param)  # type: ignore[index]
    assert upstream_calls(upstream) == calls
    # a block type the gateway does not know goes to the upstream, which judges it
    kept = [{"type": "future_block", "x": 1}, {"type": "text", "text": "hi"}]
    client(gw.url).messages.create(
        model="claude-test",
        max_tokens=64,
        messages=[{"role": "user", "content": kept}],  # type: ignore[list-item]
    )
    assert upstream_calls(upstream) == calls + 1
