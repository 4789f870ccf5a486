"""Cacheability: which requests may be looked up or stored, which responses may be kept.

Works on plain header values (strings), so the cache stays free of any HTTP library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_PRIVATE = frozenset({"private", "no-store"})


def _directives(value: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    if not value:
        return out
    for part in value.split(","):
        name, _, arg = part.strip().partition("=")
        if name:
            out[name.strip().lower()] = arg.strip().strip('"') if arg else None
    return out


@dataclass(frozen=True, slots=True)
class RequestDirectives:
    """What the client's Cache-Control asks of the cache."""

    lookup: bool = True
    store: bool = True
    max_age: float | None = None

    def acceptable(self, age: float) -> bool:
        return self.max_age is None or age <= self.max_age


DEFAULT = RequestDirectives()


def request_directives(cache_control: str | None, pragma: str | None = None) -> RequestDirectives:
    """no-cache: skip the lookup but store; no-store: skip both; max-age=N: bound the hit's age."""
    if not cache_control and not pragma:
        return DEFAULT
    d = _directives(cache_control)
    no_cache = "no-cache" in d or (not cache_control and (pragma or "").lower() == "no-cache")
    no_store = "no-store" in d
    max_age: float | None = None
    raw = d.get("max-age")
    if raw is not None:
        try:
            max_age = max(0.0, float(raw))
        except ValueError:
            max_age = 0.0  # an unreadable bound is the strictest one
    return RequestDirectives(lookup=not (no_cache or no_store), store=not no_store, max_age=max_age)


def response_storable(status: int, headers: Iterable[tuple[str, str]]) -> bool:
    """Only 2xx; never a response that sets a cookie or says private / no-store."""
    if not 200 <= status < 300:
        return False
    for k, v in headers:
        lk = k.lower()
        if lk == "set-cookie":
            return False
        if lk == "cache-control" and _PRIVATE & _directives(v).keys():
            return False
    return True


def response_shareable(status: int, headers: Iterable[tuple[str, str]]) -> bool:
    """May waiters of a single flight receive this answer? Errors yes; private answers no."""
    if 200 <= status < 300:
        return response_storable(status, headers)
    return not any(k.lower() == "set-cookie" for k, _ in headers)
