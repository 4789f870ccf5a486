"""Every cached route's flow for one config generation (gateway.runtime holds it beside the
routes, so a request keys and stores with the routes it started on)."""

from __future__ import annotations

from collections.abc import Mapping

from cache.flow import CacheFlow


class Flows:
    """Every cached route's flow, by route name; a reload builds a new set (with no remembered
    request → key aliases: a changed key policy could make one point at an entry the new one
    would not match)."""

    def __init__(self, flows: Mapping[str, CacheFlow] | None = None) -> None:
        self._flows: dict[str, CacheFlow] = dict(flows or {})

    def get(self, route: str) -> CacheFlow | None:
        return self._flows.get(route)
