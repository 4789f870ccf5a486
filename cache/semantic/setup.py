"""Build the semantic stage from settings: one stage per process, one SemanticRoute per route.

`build_semantic` is cheap (verifiers, index); `open()` loads the embedder (seconds: the ONNX
export is cached on disk) and starts Redis sync; `aclose()` stops both. Returns None when no
route enables semantic caching, so nothing is loaded for nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.embedder import Embedder, load_embedder
from cache.keys import Selector
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.semantic.verifier import load_verifier
from cache.settings import CachePolicy, CacheSettings

log = logging.getLogger("latentgate.semantic")


class RouteLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def cache(self) -> CachePolicy: ...


class _Pending:
    """Stands in for the embedder until open() has loaded it (lookups before then miss)."""

    dim = 384
    device = "pending"
    backend = "pending"

    async def embed(self, text: str) -> Any:
        raise RuntimeError("the semantic embedder is still loading")

    def embed_sync(self, texts: list[str]) -> Any:
        raise RuntimeError("the semantic embedder is still loading")

    async def aclose(self) -> None:
        return None


class SemanticSetup:
    def __init__(
        self,
        settings: CacheSettings,
        registry: CollectorRegistry,
        routes: Sequence[RouteLike],
        engine_metrics: Callable[[], Any] | None = None,
    ) -> None:
        s = settings.semantic
        self.settings = settings
        self.registry = registry
        # The engine layer's metrics are registered once per app; the embedder shares them.
        self._engine_metrics = engine_metrics
        self.metrics = SemanticMetrics(registry)
        self.index = VectorIndex(
            384, flat_max=s.flat_max, hnsw_m=s.hnsw_m, ef_search=s.ef_search, device=s.device
        )
        max_entries = max(r.cache.semantic.max_entries for r in routes)
        self.stage = SemanticStage(_Pending(), self.index, self.metrics, max_entries)
        self.routes: dict[str, SemanticRoute] = {}
        for r in routes:
            p = r.cache.semantic
            if not r.cache.exact.enabled:
                log.warning(
                    "route %s: semantic caching needs the exact cache (it holds the "
                    "payload); semantic stays off",
                    r.name,
                )
                continue
            ver = load_verifier(p.verifier, p.threshold, p.min_score, s.verifier_artifact)
            self.routes[r.name] = SemanticRoute(self.stage, r.name, p, ver)
        self._sync: RedisSync | None = None
        self._redis: Redis | None = None

    async def open(self) -> None:
        s = self.settings.semantic
        shared = self._engine_metrics() if self._engine_metrics is not None else None
        embedder: Embedder = await asyncio.to_thread(
            load_embedder, s.model, s.providers, self.registry, shared
        )
        self.stage.embedder = embedder
        self.stage.metrics.device.labels(embedder.device, self.index.device).set(1)
        log.info(
            "semantic stage: embedder %s on %s (%s), index on %s, routes %s",
            s.model,
            embedder.device,
            embedder.backend,
            self.index.device,
            sorted(self.routes),
        )
        redis = self.settings.redis
        if s.sync and redis is not None and redis.url:
            self._redis = Redis.from_url(
                redis.url,
                socket_timeout=max(redis.timeouts.op, 0.5),
                socket_connect_timeout=redis.timeouts.connect,
            )
            self._sync = RedisSync(self.stage, self._redis, redis.key_prefix)
            await self._sync.start()

    async def purge(self, selector: Selector) -> int:
        """Remove the vectors whose exact entries a purge removed."""
        keys = [e.exact_key for e in self.stage.entries.values() if selector.matches(e.exact_key)]
        for k in keys:
            await self.stage.remove_key(k)
        return len(keys)

    async def aclose(self) -> None:
        if self._sync is not None:
            await self._sync.aclose()
        if self._redis is not None:
            await self._redis.aclose()
        await self.stage.embedder.aclose()


def build_semantic(
    settings: CacheSettings,
    registry: CollectorRegistry,
    routes: Sequence[RouteLike],
    engine_metrics: Callable[[], Any] | None = None,
) -> SemanticSetup | None:
    enabled = [r for r in routes if r.cache.semantic.enabled]
    return SemanticSetup(settings, registry, enabled, engine_metrics) if enabled else None


def semantic_routes(setup: SemanticSetup | None) -> Mapping[str, SemanticRoute]:
    return {} if setup is None else setup.routes
