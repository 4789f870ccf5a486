"""Pool: the replicas of one backend (Envoy's cluster) and the policy for sending to them.

The foundation picks replicas round-robin; balancing, health, retries and hedging layer on here.
"""

from __future__ import annotations

import itertools

from backends.base import UpstreamRequest, UpstreamResponse
from backends.remote.transports.http1 import Http1Transport
from backends.settings import RemoteBackendSettings


class Pool:
    def __init__(self, name: str, settings: RemoteBackendSettings) -> None:
        self.name = name
        self.settings = settings
        self.transports = [Http1Transport(u, settings.pool, settings.timeouts) for u in settings.replicas]
        self._next = itertools.cycle(range(len(self.transports)))

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        return await self.transports[next(self._next)].send(request)

    def ready(self) -> bool:
        return True

    def describe(self) -> dict[str, object]:
        return {
            "kind": "remote",
            "replicas": [{"url": t.url, "pool": t.pool_stats()} for t in self.transports],
        }

    def pool_stats(self) -> dict[str, dict[str, int]]:
        return {t.url: t.pool_stats() for t in self.transports}

    async def aclose(self) -> None:
        for t in self.transports:
            await t.aclose()
