"""Cache-Control semantics, storability, the entry codec and the breaker's state machine."""

from __future__ import annotations

import time

import pytest

from cache.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from cache.codec import CacheEntry, decode, encode
from cache.errors import CodecError
from cache.policy import (
    initial_age,
    request_directives,
    response_shareable,
    response_storable,
    storable_ttl,
)


def test_request_cache_control() -> None:
    d = request_directives(None)
    assert d.lookup and d.store and d.acceptable(1e9)
    d = request_directives("no-cache")
    assert not d.lookup and d.store
    d = request_directives("no-store")
    assert not d.lookup and not d.store
    d = request_directives("max-age=5")
    assert d.lookup and d.acceptable(4.9) and not d.acceptable(5.1)
    assert request_directives(None, "no-cache").lookup is False
    # Pragma is a comma-separated list (RFC 9111 5.4), read only without a Cache-Control
    for pragma in ("no-cache, x-foo", "x-foo, no-cache", " No-Cache ,", "x=1,no-cache"):
        d = request_directives(None, pragma)
        assert (d.lookup, d.store, d.reason) == (False, True, ""), pragma
    assert request_directives(None, "x-no-cache").lookup
    assert request_directives("max-age=5", "no-cache, x-foo").lookup
    assert not request_directives("max-age=oops").acceptable(0.5)
    d = request_directives("min-fresh=60")
    assert d.acceptable(0.0, time.time() + 120) and not d.acceptable(0.0, time.time() + 30)
    assert d.acceptable(0.0)  # (no expiry known: nothing to hold against it)
    assert not request_directives("min-fresh=soon").acceptable(0.0, time.time() + 1e6)
    assert request_directives("min-fresh").min_fresh is None  # no argument: no bound
    # an argument that is there but not delta-seconds is the strictest reading, however spelt
    for bad in ("min-fresh=", 'min-fresh=""', "min-fresh=-5", "min-fresh=inf", "min-fresh=1_0"):
        assert request_directives(bad).min_fresh == float("inf"), bad
    for bad in ("max-age=", "max-age=nan", "max-age=-1"):
        assert request_directives(bad).max_age == 0.0, bad
    assert request_directives('max-age="30"').max_age == 30.0


@pytest.mark.parametrize(
    ("status", "headers", "storable"),
    [
        (200, [("Content-Type", "application/json")], True),
        (203, [], True),
        (201, [], False),  # reports an action: not an answer to replay
        (206, [], False),  # part of an answer, for one Range
        (404, [], False),
        (500, [], False),
        (200, [("Set-Cookie", "a=b")], False),
        (200, [("Cache-Control", "private, max-age=10")], False),
        (200, [("cache-control", "no-store")], False),
        (200, [("Cache-Control", "no-cache")], True),
    ],
)
def test_response_storable(status: int, headers: list[tuple[str, str]], storable: bool) -> None:
    assert response_storable(status, headers) is storable


def test_errors_are_shared_but_private_answers_are_not() -> None:
    assert response_shareable(500, [])
    assert not response_shareable(200, [("Set-Cookie", "a=b")])
    assert not response_shareable(200, [("Cache-Control", "private")])
    # a partial or not-modified answer is for the request's own Range / precondition
    assert not response_shareable(206, [])
    assert not response_shareable(304, [])
    # nor an answer the cache may not reuse: no-cache, or no freshness left (RFC 9111 4)
    assert not response_shareable(200, [("Cache-Control", "no-cache")])
    assert not response_shareable(200, [("Cache-Control", "max-age=600"), ("Age", "600")])
    assert response_shareable(200, [("Cache-Control", "max-age=600"), ("Age", "599")])
    # on an event stream no-cache is the streaming hint, not a word on reuse
    sse = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
    assert response_shareable(200, sse)


def test_codec_round_trip_and_garbage() -> None:
    e = CacheEntry(
        200,
        [("A", "b")],
        events=[b"data: 1", b"data: [DONE]"],
        ttl=5,
        model="m",
        policy_version="v1",
        kind="chat",
    )
    assert decode(encode(e)) == e
    for bad in (b"", b"\xc1", encode(e)[:-3], b"\x93\x01\x02\x03"):
        with pytest.raises(CodecError):
            decode(bad)
    # what no upstream answer could have been: a status outside 100-599, a header line that
    # would split the response it is replayed into
    for status, headers in (
        (0, [("A", "b")]),
        (99, [("A", "b")]),
        (600, [("A", "b")]),
        (200, [("A\r\nB", "c")]),
        (200, [("A", "b\nSet-Cookie: x=y")]),
        (200, [("A", "b\x00")]),
        (200, [("", "b")]),
        # nor what aiohttp's writer refuses mid-response (the hit writer would replay it)
        (200, [("A", "b\x7fc")]),
        (200, [("A", "b\x01c")]),
        (200, [("A B", "c")]),
        (200, [("A:", "c")]),
    ):
        with pytest.raises(CodecError):
            decode(encode(CacheEntry(status, headers, body=b"{}")))
    assert decode(encode(CacheEntry(599, [("A", "b c")], body=b""))).status == 599
    kept = [("X-Name", "caf\u00e9 \u65e5\tok")]  # obs-text and HTAB are field content
    assert decode(encode(CacheEntry(200, kept, body=b""))).headers == kept


def test_breaker_opens_probes_and_closes() -> None:
    now = [0.0]
    changes: list[int] = []
    b = Breaker(2, 1.0, on_change=changes.append, clock=lambda: now[0])
    assert b.allow()
    b.failure()
    assert b.state == CLOSED
    b.failure()
    assert b.state == OPEN and not b.allow()
    b.success()  # a late answer from before the outage does not close it
    assert b.state == OPEN
    now[0] = 1.5
    assert b.allow() and b.state == HALF_OPEN
    assert not b.allow()  # one probe at a time
    b.failure()
    assert b.state == OPEN
    now[0] = 3.0
    assert b.allow()
    b.success()
    assert b.state == CLOSED and changes == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED]


def test_an_origins_answer_is_new_however_long_it_took() -> None:
    """No Age: the origin made its answer as it sent it, so a 30 s generation is not age (the
    RFC's reading would never store a completion slower than its max-age); with an Age, the
    answer came from a cache and the delay counts."""
    origin = [("Cache-Control", "max-age=20")]
    assert initial_age(origin, 30.0) == 0.0
    assert storable_ttl(200, origin, 3600, age=initial_age(origin, 30.0)) == (20.0, "")
    cached = [*origin, ("Age", "5")]
    assert initial_age(cached, 30.0) == 35.0
    assert storable_ttl(200, cached, 3600, age=initial_age(cached, 30.0)) == (0.0, "stale")
