"""Cacheability: which requests may be looked up or stored, which responses may be kept.

Works on plain header values (strings), so the cache stays free of any HTTP library.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

_DELTA = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_PRIVATE = frozenset({"private", "no-store"})
_REFUSED = frozenset({"private", "no-store", "no-cache"})
_REFUSED_SSE = _PRIVATE


def _directives(value: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    if not value:
        return out
    for part in value.split(","):
        name, eq, arg = part.strip().partition("=")
        if name:
            # "x=" and 'x=""' both give "": an argument that is there but empty
            out[name.strip().lower()] = arg.strip().strip('"') if eq else None
    return out


@dataclass(frozen=True, slots=True)
class RequestDirectives:
    """What the client's Cache-Control asks of the cache."""

    lookup: bool = True
    store: bool = True
    max_age: float | None = None
    # only-if-cached (RFC 9111 5.2.1.7): answer from the cache or not at all (504), never
    # going upstream for it.
    only_if_cached: bool = False
    # min-fresh=N (RFC 9111 5.2.1.3): an answer that stays fresh for N more seconds at least.
    min_fresh: float | None = None
    # why the cache is bypassed when it is for something other than Cache-Control: no-store
    reason: str = ""

    def acceptable(self, age: float, expires_at: float | None = None) -> bool:
        """An entry of this age (expiring at expires_at, wall clock) answers this request."""
        if self.max_age is not None and age > self.max_age:
            return False
        if self.min_fresh is None or expires_at is None:
            return True
        return expires_at - time.time() >= self.min_fresh


DEFAULT = RequestDirectives()


# A request carrying one of these asks for part of an answer, or for one only under a
# condition about a representation the client holds (RFC 9110 13, 14): its answer (a 206, a
# 304, a 412) is for that request alone, and the key holds none of them.
CONDITIONAL_HEADERS = (
    "Range",
    "If-Range",
    "If-Match",
    "If-None-Match",
    "If-Modified-Since",
    "If-Unmodified-Since",
)


# The methods whose answers the cache may look up or store (POST: an inference call, which the
# route's exact cache keys by its body). Any other (PUT, PATCH, DELETE, ...) changes something
# upstream: replaying its answer would skip that change (RFC 9111 2, 4.4).
CACHED_METHODS = frozenset({"GET", "HEAD", "POST"})
# Methods that change nothing (RFC 9110 9.2.1): not cached either, but they invalidate nothing
# (a CORS preflight OPTIONS must not drop the cached GET of its target).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def request_directives(
    cache_control: str | None,
    pragma: str | None = None,
    conditional: bool = False,
    head: bool = False,
    unsafe: bool = False,
) -> RequestDirectives:
    """no-cache: skip the lookup but store; no-store: skip both; max-age=N: bound the hit's age;
    min-fresh=N: the hit must stay fresh N seconds more; only-if-cached: a hit or nothing.
    unsafe (a method not in CACHED_METHODS), conditional (a Range or a precondition header) and
    head (a HEAD request, whose answer has no body to store): neither looked up nor stored, nor
    joined to another request's flight."""
    if unsafe or conditional or head:
        only = "only-if-cached" in _directives(cache_control)
        reason = "unsafe-method" if unsafe else "conditional" if conditional else "head"
        return RequestDirectives(False, False, only_if_cached=only, reason=reason)
    if not cache_control and not pragma:
        return DEFAULT
    d = _directives(cache_control)
    # Pragma is a list too (RFC 9111 5.4: "no-cache, x-foo", or two lines combined); it counts
    # only when there is no Cache-Control
    no_cache = "no-cache" in d or (not cache_control and "no-cache" in _directives(pragma))
    no_store = "no-store" in d
    return RequestDirectives(
        lookup=not (no_cache or no_store),
        store=not no_store,
        max_age=_seconds(d, "max-age", 0.0),
        only_if_cached="only-if-cached" in d,
        # an unreadable min-fresh is the strictest: no stored answer is fresh for ever
        min_fresh=_seconds(d, "min-fresh", float("inf")),
    )


def _seconds(d: dict[str, str | None], name: str, unreadable: float) -> float | None:
    """A delta-seconds argument (RFC 9111 1.2.2: digits; a decimal fraction is tolerated). None:
    the directive is absent or bare; `unreadable` for anything else ("", "-5", "inf", "1_0"),
    the strictest reading of what the client asked."""
    if name not in d:
        return None
    raw = d[name]
    if raw is None:
        return None
    if _DELTA.fullmatch(raw) is None:
        return unreadable
    return float(raw)


class NotCached(Exception):
    """only-if-cached and the cache has no answer it may serve: the client gets a 504."""


# 2xx answers a key fully determines (RFC 9110 15.1's heuristically cacheable ones): not a
# 206 (part of an answer, for one Range), nor 201/202/205, which report an action.
_STORED_STATUSES = frozenset({200, 203, 204})


def response_storable(status: int, headers: Iterable[tuple[str, str]]) -> bool:
    """Only 200, 203, 204; never a response that sets a cookie or says private / no-store."""
    if status not in _STORED_STATUSES:
        return False
    for k, v in headers:
        lk = k.lower()
        if lk == "set-cookie":
            return False
        if lk == "cache-control" and _PRIVATE & _directives(v).keys():
            return False
    return True


def response_shareable(
    status: int,
    headers: Iterable[tuple[str, str]],
    keyed: Collection[str] = (),
    now: float | None = None,
    age: float | None = None,
) -> bool:
    """May waiters of a single flight receive this answer? Errors yes; private answers no; nor
    a 206 or a 304, which answer one request's Range or precondition; nor an answer that Varies
    on a request header the key does not hold (`keyed`, lower case): a waiter that sent another
    value of it would get an answer chosen for someone else's header. Nor a 2xx the cache may
    not reuse (RFC 9111 4: collapsed requests get an answer only where it could serve them
    from the store): `no-cache` (but on an event stream, where it is the streaming hint), or no
    freshness left (`max-age=0`, an `Expires` not past its `Date`, an `Age` at its bound).
    age: the answer's age on arrival (`initial_age`), else its Age as sent."""
    headers = list(headers)
    if varies_unkeyed(headers, keyed):
        return False
    if 200 <= status < 300 or status == 304:
        if not response_storable(status, headers) or _refused(headers) & {"no-cache"}:
            return False
        fresh = _freshness(headers, time.time() if now is None else now, age)
        return fresh is None or fresh > 0
    return not any(k.lower() == "set-cookie" for k, _ in headers)


def _refused(headers: list[tuple[str, str]]) -> set[str]:
    """The Cache-Control directives that keep this answer from being reused: private,
    no-store, no-cache; no-cache does not count on an event stream (servers send it so that
    proxies pass a live stream through unbuffered; it says nothing of the finished stream)."""
    sse = any(k.lower() == "content-type" and "text/event-stream" in v for k, v in headers)
    refused = _REFUSED_SSE if sse else _REFUSED
    found: set[str] = set()
    for k, v in headers:
        if k.lower() == "cache-control":
            found |= refused & _directives(v).keys()
    return found


def varies_unkeyed(headers: Iterable[tuple[str, str]], keyed: Collection[str]) -> bool:
    """Does the answer name, in Vary, a request header the key does not hold? Accept-Encoding
    does not count: cached routes ask the upstream for identity."""
    for k, v in headers:
        if k.lower() == "vary":
            for name in v.split(","):
                name = name.strip().lower()
                if name and name != "accept-encoding" and name not in keyed:
                    return True
    return False


def _freshness(
    headers: Iterable[tuple[str, str]], now: float, age_now: float | None = None
) -> float | None:
    """Seconds the upstream lets a shared cache keep its answer (RFC 9111 4.2.1), or None when
    it does not say: s-maxage over max-age over Expires, less the age it already has (age_now,
    else the Age it was sent with)."""
    bounds: dict[str, list[str | None]] = {}
    expires = date = age = None
    for k, v in headers:
        lk = k.lower()
        if lk == "cache-control":
            for part in v.split(","):
                for name, arg in _directives(part).items():
                    if name in ("s-maxage", "max-age"):
                        bounds.setdefault(name, []).append(arg)
        elif lk == "expires":
            expires = v
        elif lk == "date":
            date = v
        elif lk == "age":
            age = v
    lifetime: float | None = None
    for name in ("s-maxage", "max-age"):
        if name in bounds:
            # delta-seconds (RFC 9111 1.2.2): digits. An unreadable bound ("1e9", "inf", "",
            # "-5", bare) is the strictest one, and so is the least of a directive given twice
            # (4.2.1: the first, or stale); before, float() took "inf", and the last one won.
            lifetime = min(
                float(a) if a is not None and _DELTA.fullmatch(a) else 0.0 for a in bounds[name]
            )
            break
    if lifetime is None and expires is not None:
        at = _http_date(expires)
        base = _http_date(date) if date is not None else None
        # an invalid Expires (e.g. "0") means already expired (RFC 9111 5.3)
        lifetime = 0.0 if at is None else max(0.0, at - (base if base is not None else now))
    if lifetime is None:
        return None
    if age_now is not None:
        return max(0.0, lifetime - age_now)
    with contextlib.suppress(ValueError):  # an unreadable Age counts as none
        lifetime -= max(0.0, float(age)) if age is not None else 0.0
    return max(0.0, lifetime)


def initial_age(headers: Iterable[tuple[str, str]], response_delay: float) -> float:
    """An upstream answer's age as it arrives (RFC 9111 4.2.3, corrected_age_value): the Age it
    was sent with (5.1: delta-seconds) plus the response delay, the time from sending the
    request to its answer: an upstream cache may have taken its Age as the request reached it.
    Without an Age (or with an unreadable one) the answer is new: 0. An origin makes its answer
    as it sends it, so a generation's seconds are not age (the RFC's reading would take them
    off every answer's freshness, and a 30 s completion under max-age=30 would never be
    stored). Date's apparent age is not used (a replica's clock is not the gateway's: skew
    would age, or expire, every answer)."""
    for k, v in headers:
        if k.lower() == "age":
            v = v.strip()
            if v.isascii() and v.isdigit():
                return float(v) + max(0.0, response_delay)
            break
    return 0.0


def _http_date(value: str) -> float | None:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.timestamp() if parsed is not None else None


def storable_ttl(
    status: int,
    headers: Iterable[tuple[str, str]],
    ttl: float,
    keyed: Collection[str] = (),
    now: float | None = None,
    age: float | None = None,
) -> tuple[float, str]:
    """How long an answer may be stored (the route's TTL bounded by the upstream's freshness),
    or 0 with the reason it may not be.

    Not stored: any status but 200, 203, 204, `Set-Cookie`, `private` / `no-store` / `no-cache`
    (the gateway does not revalidate; on an event stream no-cache is the streaming hint and
    does not count), a zero or
    past freshness, a `Content-Encoding` (the gateway asks for identity on cached routes so
    every client can take the entry), and a `Vary` on a request header the key does not hold
    (`keyed`, lower case; Accept-Encoding is neutralised by asking for identity).
    age: the answer's age on arrival (`initial_age`), else its Age as sent.
    """
    if status not in _STORED_STATUSES:
        return 0.0, "status"
    headers = list(headers)
    refused = _refused(headers)
    for k, v in headers:
        lk = k.lower()
        if lk == "set-cookie":
            return 0.0, "set-cookie"
        if lk == "cache-control" and refused:
            return 0.0, "cache-control"
        if lk == "content-encoding" and v.strip().lower() not in ("", "identity"):
            return 0.0, "content-encoding"
    if varies_unkeyed(headers, keyed):
        return 0.0, "vary"
    fresh = _freshness(headers, time.time() if now is None else now, age)
    if fresh is not None and fresh <= 0.0:
        return 0.0, "stale"
    return (ttl if fresh is None else min(ttl, fresh)), ""
