"""Routes are data from config; the router walks them in order (first FULL match wins).

A path that matched with the wrong method is remembered so the caller can answer 405, not 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from backends import RoutePolicy
from cache import CachePolicy
from gateway.config import RouteSettings
from gateway.protocols.base import Adapter

_DEFAULT_UPSTREAM = RoutePolicy()  # frozen: safe to share


class Match(Enum):
    NONE = 0
    PARTIAL = 1
    FULL = 2


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    protocol: str
    backend: str
    policy: CachePolicy
    adapter: Adapter
    path: str | None
    prefix: str | None
    methods: frozenset[str] | None
    model: str | None
    upstream: RoutePolicy = _DEFAULT_UPSTREAM
    max_items: int = 2048  # route.limits.max_items: rows per request (gRPC checks it here)

    @classmethod
    def from_settings(cls, s: RouteSettings, adapter: Adapter) -> Route:
        return cls(
            name=s.name,
            protocol=s.protocol,
            backend=s.backend,
            policy=s.cache,
            adapter=adapter,
            path=s.match.path,
            prefix=s.match.prefix,
            methods=_methods(s.match.methods),
            model=s.match.model,
            upstream=_upstream_policy(s),
            max_items=s.limits.max_items,
        )

    def matches(self, method: str, path: str) -> Match:
        if self.path is not None:
            hit = path == self.path or path == self.path + "/"
        else:
            assert self.prefix is not None
            hit = path.startswith(self.prefix)
        if not hit:
            return Match.NONE
        if self.methods is not None and method not in self.methods:
            return Match.PARTIAL
        return Match.FULL


def _methods(names: list[str] | None) -> frozenset[str] | None:
    """A route that takes GET takes HEAD too (RFC 9110 9.3.2: the same answer without its
    content), so a HEAD is answered where its GET is, not by a later route or a 405."""
    if not names:
        return None
    methods = {m.upper() for m in names}
    if "GET" in methods:
        methods.add("HEAD")
    return frozenset(methods)


def _upstream_policy(s: RouteSettings) -> RoutePolicy:
    """Inference calls (openai, v2 routes) are idempotent unless the route says otherwise."""
    if s.upstream.idempotent is None and s.protocol != "passthrough":
        return s.upstream.model_copy(update={"idempotent": True})
    return s.upstream


# Resolutions remembered per router: the model paths are few and asked for again and again;
# past this many distinct (method, path) pairs (a client spraying paths) the rest are computed.
_MEMO_MAX = 4096


class Router:
    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._memo: dict[tuple[str, str], tuple[list[Route], bool]] = {}

    def resolve(self, method: str, path: str) -> tuple[list[Route], bool]:
        """Routes that fully match, in config order, and whether any matched the path only.
        (The list is shared between calls: callers read it, never change it.)"""
        found = self._memo.get((method, path))
        if found is None:
            found = self._resolve(method, path)
            if len(self._memo) < _MEMO_MAX:
                self._memo[(method, path)] = found
        return found

    def _resolve(self, method: str, path: str) -> tuple[list[Route], bool]:
        full: list[Route] = []
        partial = False
        for route in self.routes:
            m = route.matches(method, path)
            if m is Match.FULL:
                full.append(route)
                if route.model is None:
                    break  # later routes can never be chosen over a model-agnostic match
            elif m is Match.PARTIAL:
                partial = True
        return full, partial

    @staticmethod
    def pick_by_model(candidates: list[Route], model: str | None) -> Route | None:
        for route in candidates:
            if route.model is None or route.model == model:
                return route
        return None
