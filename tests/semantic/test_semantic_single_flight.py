"""Semantic single flight through the gateway: a paraphrase that arrives while an equivalent
miss is in flight waits for that answer instead of calling the upstream too."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.semantic.test_budget_gateway import admin_state, wait_for
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.servers import ServerThread
from tests.support.upstream import build_upstream

Q = "How do I reset my password?"
PARA = "How can I reset my password?"


@pytest.fixture
def slow_upstream() -> Iterator[ServerThread]:
    server = ServerThread(lambda: build_upstream(delay=1.5)).start()
    yield server
    server.stop()


def upstream_calls(upstream: ServerThread) -> int:
    with urllib.request.urlopen(upstream.url + "/_test/stats", timeout=5) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return int(doc["requests"].get("/v1/chat/completions", 0))


def paraphrase_during_flight(
    gw: ServerThread, question: str, leader_extra: dict[str, Any] | None = None
) -> tuple[str, Any]:
    """Q goes upstream (with leader_extra) and, once its flight is registered, `question` is
    asked by the same tenant: its text and headers."""
    extra = leader_extra or {}
    leader = threading.Thread(target=lambda: ask(client_for(gw.url), Q, temperature=0, **extra))
    leader.start()
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
    answer = ask(client_for(gw.url), question, temperature=0)
    leader.join()
    return answer


def test_a_paraphrase_waits_for_the_miss_in_flight(
    slow_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(slow_upstream.url))
    c = client_for(gw.url)
    got: dict[str, Any] = {}
    leader = threading.Thread(target=lambda: got.update(first=ask(c, Q, temperature=0)))
    leader.start()
    # the paraphrase goes once the leader's flight is registered (it is still upstream)
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
    text, headers = ask(client_for(gw.url), PARA, temperature=0)
    leader.join()
    first, first_headers = got["first"]
    assert first_headers["x-cache"] == "miss"
    assert headers["x-cache"] == "semantic-hit" and text == first  # the leader's answer
    assert float(headers["x-cache-similarity"]) > 0.9
    assert upstream_calls(slow_upstream) == 1
    assert admin_state(gw.url)["pending_flights"] == 0


def test_an_unrelated_question_does_not_wait(
    slow_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(slow_upstream.url))
    text, headers = paraphrase_during_flight(gw, "How do I delete my account?")
    assert headers["x-cache"] == "miss" and "delete my account" in text
    assert upstream_calls(slow_upstream) == 2


def test_another_tenants_paraphrase_does_not_wait_for_the_miss_in_flight(
    slow_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(slow_upstream.url))
    leader = threading.Thread(target=lambda: ask(client_for(gw.url), Q, temperature=0))
    leader.start()
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
    # the same paraphrase that waits for the leader above, from another API key: its own call
    text, headers = ask(client_for(gw.url, "sk-bob"), PARA, temperature=0)
    leader.join()
    assert headers["x-cache"] == "miss" and "can I reset" in text
    assert upstream_calls(slow_upstream) == 2


def _post(url: str, question: str) -> tuple[int, dict[str, str]]:
    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": question}]}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-one"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_a_paraphrase_does_not_get_the_leaders_error(
    start_gateway: Callable[..., ServerThread],
) -> None:
    """The leader's 429 names its own quota: an identical request may share it, a paraphrase
    asks the upstream itself and is never told the error is a semantic hit."""
    failing = ServerThread(lambda: build_upstream(delay=1.5, fail_status=429)).start()
    try:
        gw = start_gateway(semantic_config(failing.url))
        got: dict[str, Any] = {}
        leader = threading.Thread(target=lambda: got.update(first=_post(gw.url, Q)))
        leader.start()
        wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
        status, headers = _post(gw.url, PARA)
        leader.join()
        assert got["first"][0] == 429 and status == 429
        assert headers.get("X-Cache") != "semantic-hit" and "X-Cache-Entry" not in headers
        assert upstream_calls(failing) == 2
    finally:
        failing.stop()


@pytest.mark.parametrize("said", ["no-cache", "max-age=0"])
def test_a_paraphrase_does_not_get_an_answer_the_upstream_said_not_to_keep(
    slow_upstream: ServerThread, start_gateway: Callable[..., ServerThread], said: str
) -> None:
    """The leader's answer comes with Cache-Control: no-cache (or max-age=0): it is not stored,
    so it is no semantic hit for a paraphrase waiting on it either; that one goes upstream."""
    gw = start_gateway(semantic_config(slow_upstream.url))
    keep_out = {"extra_headers": {"X-Test-Cache-Control": said}}
    text, headers = paraphrase_during_flight(gw, PARA, keep_out)
    assert headers["x-cache"] == "miss" and "can I reset" in text
    assert upstream_calls(slow_upstream) == 2


@pytest.mark.parametrize(
    ("leader_said", "asked"),
    [
        ({"X-Test-Age": "100"}, "max-age=10"),  # the answer is 100 s old
        ({"X-Test-Cache-Control": "max-age=20"}, "min-fresh=600"),  # it expires in 20 s
    ],
)
def test_a_paraphrase_joins_a_flight_only_for_an_answer_its_cache_control_takes(
    slow_upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    leader_said: dict[str, str],
    asked: str,
) -> None:
    """A paraphrase asking for an answer no older than max-age (or fresh for min-fresh more) is
    not served the in-flight leader's answer when that answer fails it, as the same answer found
    in the index would not be (RouteCache.payload): it goes upstream itself."""
    gw = start_gateway(semantic_config(slow_upstream.url))
    leader = threading.Thread(
        target=lambda: ask(client_for(gw.url), Q, temperature=0, extra_headers=leader_said)
    )
    leader.start()
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
    text, headers = ask(
        client_for(gw.url), PARA, temperature=0, extra_headers={"Cache-Control": asked}
    )
    leader.join()
    assert headers["x-cache"] == "miss" and "can I reset" in text
    assert upstream_calls(slow_upstream) == 2


def test_a_paraphrase_does_not_get_an_answer_too_large_to_keep(
    slow_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """An answer over max_entry_bytes is not stored, so it is no semantic hit either."""
    cfg = semantic_config(slow_upstream.url)
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["max_entry_bytes"] = 300  # the echo's answers are larger
    gw = start_gateway(cfg)
    text, headers = paraphrase_during_flight(gw, PARA)
    assert headers["x-cache"] == "miss" and "can I reset" in text
    assert upstream_calls(slow_upstream) == 2


def streamed_leader(
    gw: ServerThread,
    upstream: ServerThread,
    headers: dict[str, str],
    gap: float = 0.3,
    **extra: Any,
) -> tuple[threading.Thread, dict[str, str]]:
    """Q streamed (its events `gap` s apart, ~9 of them) in a thread, once it is upstream."""
    got: dict[str, str] = {}

    def run() -> None:
        chunks = client_for(gw.url).chat.completions.create(
            model="m",
            temperature=0,
            stream=True,
            messages=[{"role": "user", "content": Q}],
            extra_headers={"X-Test-Event-Delay": str(gap), **headers},
            **extra,
        )
        got["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    leader = threading.Thread(target=run)
    leader.start()
    wait_for(lambda: upstream_calls(upstream) == 1, "the leader's stream under way")
    return leader, got


@pytest.mark.parametrize("headers", [{}, {"X-Test-Delay": "1.0"}])  # (joined before its headers)
def test_a_paraphrase_waits_out_a_streamed_miss_it_can_be_rendered_from(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], headers: dict[str, str]
) -> None:
    # The leader's headers come at once, its events over ~3 s: its question stays announced
    # until the stream is recorded. A one-body paraphrase takes it (the stream has its usage).
    gw = start_gateway(semantic_config(upstream.url))
    leader, got = streamed_leader(gw, upstream, headers, stream_options={"include_usage": True})
    text, h = ask(client_for(gw.url), PARA, temperature=0)
    leader.join()
    assert (text, h["x-cache"]) == (got["text"], "semantic-hit")
    assert upstream_calls(upstream) == 1
    assert admin_state(gw.url)["pending_flights"] == 0


def test_another_tenants_paraphrase_does_not_wait_out_a_streamed_miss(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    # the leader (sk-alice) streams an answer a one-body paraphrase could be rendered from:
    # Bob's paraphrase still goes upstream itself, and gets its own answer
    gw = start_gateway(semantic_config(upstream.url))
    leader, got = streamed_leader(gw, upstream, {}, stream_options={"include_usage": True})
    text, h = ask(client_for(gw.url, "sk-bob"), PARA, temperature=0)
    leader.join()
    assert h["x-cache"] == "miss" and upstream_calls(upstream) == 2
    assert text != got["text"]  # the test upstream echoes the question it was asked


@pytest.mark.parametrize(
    ("headers", "streams"),
    [
        ({}, True),  # a streaming paraphrase would get its first token after the leader's last
        ({"X-Test-Cache-Control": "no-store"}, False),  # an answer not kept: nothing to wait for
        # the same two asked while the leader still waits for its headers: they join, then
        # stop waiting once the headers show what the leader streams
        ({"X-Test-Delay": "1.0"}, True),
        ({"X-Test-Delay": "1.0", "X-Test-Cache-Control": "no-store"}, False),
    ],
)
def test_a_paraphrase_does_not_wait_out_a_stream_it_would_not_get(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    headers: dict[str, str],
    streams: bool,
) -> None:
    gw = start_gateway(semantic_config(upstream.url))
    # (events 0.6 s apart: the leader is still streaming when the paraphrase is answered, even
    # on a loaded machine)
    leader, _ = streamed_leader(
        gw, upstream, headers, gap=0.6, stream_options={"include_usage": True}
    )
    if streams:
        chunks = client_for(gw.url).chat.completions.create(
            model="m", temperature=0, stream=True, messages=[{"role": "user", "content": PARA}]
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        assert ask(client_for(gw.url), PARA, temperature=0)[1]["x-cache"] == "miss"
    # it went upstream itself, and was answered while the leader was still streaming
    assert leader.is_alive() and upstream_calls(upstream) == 2
    leader.join()


def coalesced(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    pattern = r'^latentgate_cache_singleflight_coalesced_total\{outcome="(\w+)"\} (\S+)'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


@pytest.mark.parametrize("headers", [{}, {"X-Test-Delay": "1.0"}])  # (joined before its headers)
def test_a_paraphrase_stops_waiting_when_the_stream_outgrows_the_store(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], headers: dict[str, str]
) -> None:
    cfg = semantic_config(upstream.url)
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["max_entry_bytes"] = 1000  # the stream passes it half-way
    gw = start_gateway(cfg)
    leader, _ = streamed_leader(
        gw, upstream, headers, gap=0.6, stream_options={"include_usage": True}
    )
    assert ask(client_for(gw.url), PARA, temperature=0)[1]["x-cache"] == "miss"
    assert leader.is_alive() and upstream_calls(upstream) == 2  # it did not wait the stream out
    leader.join()
    assert coalesced(gw.url).get("shared", 0) == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_paraphrase_that_joins_while_the_leader_stores_gets_its_answer(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    # The exact flight settles before the leader stores (and indexes) its answer, and the
    # question stays announced until then: a paraphrase that joins in between must still get
    # the answer. A slow store (a slow Redis round trip) widens the window to a second.
    import cache.cache as cache_mod

    storing = threading.Event()
    store = cache_mod.RouteCache.store

    async def slow_store(self: Any, key: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        storing.set()
        await asyncio.sleep(1.0)
        return await store(self, key, entry, *args, **kwargs)

    monkeypatch.setattr(cache_mod.RouteCache, "store", slow_store)
    gw = start_gateway(semantic_config(upstream.url))
    if stream:
        leader, _ = streamed_leader(
            gw, upstream, {}, gap=0.05, stream_options={"include_usage": True}
        )
    else:
        leader = threading.Thread(target=lambda: ask(client_for(gw.url), Q, temperature=0))
        leader.start()
    assert storing.wait(10)
    assert admin_state(gw.url)["pending_flights"] == 1
    assert ask(client_for(gw.url), PARA, temperature=0)[1]["x-cache"] == "semantic-hit"
    leader.join()
    assert upstream_calls(upstream) == 1 and coalesced(gw.url)["shared"] == 1


def test_a_wait_that_got_nothing_usable_is_not_counted_as_shared(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(upstream.url))
    not_kept = {"X-Test-Delay": "1.0", "X-Test-Cache-Control": "no-cache"}
    leader = threading.Thread(
        target=lambda: ask(client_for(gw.url), Q, temperature=0, extra_headers=not_kept)
    )
    leader.start()
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")
    assert ask(client_for(gw.url), PARA, temperature=0)[1]["x-cache"] == "miss"
    leader.join()
    assert upstream_calls(upstream) == 2
    counts = coalesced(gw.url)
    assert counts.get("shared", 0) == 0 and counts["unusable"] == 1
