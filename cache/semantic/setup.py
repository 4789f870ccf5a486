"""Build the semantic stage from settings: one stage per process, one SemanticRoute per route.

`build_semantic` is cheap (verifiers, index); `start()` loads the embedder in the background
(seconds; the first start also exports it to ONNX) and then starts Redis sync, while routes serve
without the semantic stage; `aclose()` stops both. Returns None when no route enables semantic
caching, so nothing is loaded for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from backends.local import LoadProgress
from cache.embedder import Embedder, PendingEmbedder, load_embedder
from cache.keys import Selector
from cache.redis_client import REDIS_ERRORS, AnyRedis, connect, stop_task
from cache.semantic.answers import EmbeddingMatch, ExactMatch, Matcher
from cache.semantic.budget import LEARN_FLOOR, BudgetGrid, grid_edges
from cache.semantic.budget_prior import DEFAULT_PRIOR, load_prior
from cache.semantic.budget_store import BudgetStore
from cache.semantic.cross_encoder import CrossEncoder
from cache.semantic.index import VectorIndex
from cache.semantic.judge import BackendNamed, JudgeMatch, backend_judge, url_judge
from cache.semantic.label_context import in_space, label_context
from cache.semantic.learn import RouteBudget
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.preflight import RouteLike
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.semantic.tenant_labels import TenantLabelShare
from cache.semantic.verifier import (
    DEFAULT_ARTIFACT,
    CrossEncoderVerifier,
    MlpVerifier,
    Verifier,
    load_verifier,
    with_floor,
)
from cache.settings import CacheSettings, SemanticPolicy
from cache.tiers.redis_writes import WriteGate

log = logging.getLogger("latentgate.semantic")


def budget_scorer(ver: Verifier, answer_match: str = "exact") -> Verifier:
    """What a budgeted route scores (and labels) candidates with: the verifier from
    budget.LEARN_FLOOR, below the shipped floor, where scoring is cheap. A verifier too slow for
    the event loop keeps its own floor, and so does a route that pays a judge per label: there
    only misses it could serve are worth a call."""
    if ver.offload or answer_match == "judge":
        return ver
    return with_floor(ver, min(LEARN_FLOOR, ver.floor))


class SemanticSetup:
    def __init__(
        self,
        settings: CacheSettings,
        registry: CollectorRegistry,
        routes: Sequence[RouteLike],
        engine_metrics: Callable[[], Any] | None = None,
        engines: Any = None,
        backend_named: BackendNamed | None = None,
    ) -> None:
        s = settings.semantic
        # a judge that is one of the app's backends finds it here when it judges (reloads swap
        # the backends; the app factory's resolver reads the current ones)
        self._backend_named: BackendNamed = backend_named or (lambda name: None)
        self._engines = engines  # backends.local.shared.EngineShare: one MiniLM session per app
        self.settings = settings
        self.registry = registry
        # The engine layer's metrics are registered once per app; the embedder shares them.
        self._engine_metrics = engine_metrics
        self.metrics = SemanticMetrics(registry)
        self.index = VectorIndex(
            384,
            flat_max=s.flat_max,
            hnsw_m=s.hnsw_m,
            ef_search=s.ef_search,
            device=s.device,
            quantizer=s.quantizer,
        )
        max_entries = max(r.cache.semantic.max_entries for r in routes)
        self.stage = SemanticStage(
            PendingEmbedder(), self.index, self.metrics, max_entries, max_bytes=s.max_bytes
        )
        self.stage.ready = False  # routes skip the stage until the embedder is loaded
        self.progress = LoadProgress()
        self._task: asyncio.Task[None] | None = None
        self._error: str | None = None
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
            ver = load_verifier(
                p.verifier, p.threshold, p.min_score, s.verifier_artifact, s.cross_encoder_artifact
            )
            sr = SemanticRoute(self.stage, r.name, p, ver)
            if p.max_error_rate is not None:
                sr.budget = self._budget(r.name, p, ver, s.verifier_artifact, s.budget_prior)
            self.routes[r.name] = sr
        self._sync: RedisSync | None = None
        # the exact tier's write breaker (the app sets it): the index sync, the budget store
        # and the tenant labels write through it
        self.writes: WriteGate | None = None
        self._budget_store: BudgetStore | None = None
        self._tenant_labels: TenantLabelShare | None = None
        self._owned_redis: AnyRedis | None = None  # the budget store's, when sync is off
        self._cross_encoder: CrossEncoder | None = None

    def _budget(
        self,
        route: str,
        p: SemanticPolicy,
        ver: Verifier,
        verifier_artifact: str | None,
        prior_path: str | None,
    ) -> RouteBudget:
        assert p.max_error_rate is not None
        scorer = budget_scorer(ver, p.answer_match)
        cos_edges, score_edges = grid_edges(scorer.floor, ver.p_min, ver.floor)
        prior = None
        if p.prior and isinstance(ver, MlpVerifier):
            prior = load_prior(
                Path(prior_path) if prior_path else DEFAULT_PRIOR,
                Path(verifier_artifact) if verifier_artifact else DEFAULT_ARTIFACT,
                cos_edges,
                score_edges,
                p.rival_cosine,
            )
        grid = BudgetGrid(
            p.max_error_rate,
            scorer.floor,
            ver.p_min,
            delta=1.0 - p.error_confidence,
            min_labels=p.min_labels,
            prior=prior,
            half_life=p.label_half_life,
            serve_floor=ver.floor,
        )
        matcher: Matcher = ExactMatch()
        if p.answer_match == "embedding":
            matcher = EmbeddingMatch(self.stage.embed, p.answer_cosine)
        elif p.answer_match == "judge":
            assert p.judge is not None
            j = p.judge
            close = None
            if j.url is not None:
                post, close = url_judge(j.url, j.headers, j.timeout)
            else:
                assert j.backend is not None
                post = backend_judge(self._backend_named, j.backend, j.path, j.headers, j.timeout)
            matcher = JudgeMatch(post, j.model, j.body, j.max_concurrent, close)
        context = label_context(scorer, ver, p, verifier_artifact)
        return RouteBudget(
            route,
            grid,
            matcher,
            self.stage,
            self.metrics,
            p.audit_rate,
            scorer,
            context,
            tenant_guard=p.tenant_guard,
        )

    def budgets(self) -> dict[str, RouteBudget]:
        return {n: r.budget for n, r in self.routes.items() if r.budget is not None}

    def serve_only(self, names: set[str]) -> None:
        """After a reload: the routes whose semantic cache is still on (a reload can only turn
        one off); the others' budgets say they serve nothing."""
        for name, b in self.budgets().items():
            b.serving = name in names
            b.publish()

    def start(self) -> None:
        """Load in the background: the listeners open at once, /readyz shows the progress."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._open_logged())

    async def _open_logged(self) -> None:
        try:
            await self.open()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stage stays off; /readyz says why
            self._error = f"{type(exc).__name__}: {exc}"
            self.progress.step("failed", self._error)
            log.exception("semantic stage failed to load; routes serve without it")

    @property
    def ready(self) -> bool:
        return self.stage.ready

    def describe(self) -> dict[str, object]:
        return {"ready": self.ready, "load": self.progress.snapshot(), "error": self._error}

    async def open(self) -> None:
        s = self.settings.semantic
        shared = self._engine_metrics() if self._engine_metrics is not None else None
        from backends import BatcherSettings, SessionOptions

        batching = BatcherSettings(
            max_batch=s.batch_max,
            max_delay_ms=s.batch_max_delay_ms,
            target_p95_ms=s.batch_target_p95_ms,
        )
        embedder: Embedder = await asyncio.to_thread(
            load_embedder,
            s.model,
            s.providers,
            self.registry,
            shared,
            s.artifacts_dir,
            batching,
            self._engines,
            self.progress,
            # (the defaults: the same engine a local backend of this model has, shared)
            SessionOptions(intra_op_threads=s.intra_op_threads, allow_spinning=s.allow_spinning),
        )
        self.stage.embedder = embedder
        for b in self.budgets().values():
            # labels are cosines of this embedder's vectors: shared within its space only
            b.context = in_space(b.context, embedder.space)
        self.stage.metrics.device.clear()  # drop the "pending" series set before the load
        self.stage.metrics.device.labels(embedder.device, self.index.device).set(1)
        log.info(
            "semantic stage: embedder %s (%s), index on %s, routes %s",
            s.model,
            embedder.backend,
            self.index.device,
            sorted(self.routes),
        )
        for name, route in sorted(self.routes.items()):
            # The operating point usually comes from the verifier's artifact, not the config:
            # say which one each route serves.
            v = route.verifier
            bar = "" if v.name == "off" else f", score >= {v.p_min:g}"
            learn = ""
            if route.budget is not None:
                learn = (
                    f"; error budget {route.policy.max_error_rate:g}, labels from cosine "
                    f"{route.budget.scorer.floor:g}"
                )
            log.info(
                "semantic route %s: verifier %s, cosine >= %g%s%s",
                name,
                v.name,
                v.floor,
                bar,
                learn,
            )
        await self._open_cross_encoder()
        # Built (no Redis call) before the stage serves, so their hooks take every count and
        # label; built after the starts (seconds), they missed those made meanwhile.
        self._build_sharing()
        joining = self._budget_store is not None or self._tenant_labels is not None
        self._join(not joining)
        self.stage.ready = True
        self.progress.step("ready")
        try:
            # Each on its own: a fault in one (not a Redis error: those each start absorbs)
            # left the ones after it unstarted, and the stage on its own counts for good.
            for what, part in (
                ("index sync", self._sync),
                ("budget store", self._budget_store),
                ("tenant labels", self._tenant_labels),
            ):
                if part is not None:
                    try:
                        await part.start()
                    except Exception:
                        log.exception("semantic stage: the %s did not start; not shared", what)
        finally:  # (each start ends within its Redis timeouts, read or not)
            self._join(True)

    def _join(self, joined: bool) -> None:
        """Budgeted routes serve once this process has read the fleet's counts and labels."""
        for b in self.budgets().values():
            if b.joined != joined:
                b.joined = joined
                b.publish()

    def _build_sharing(self) -> None:
        redis = self.settings.redis
        if redis is None or not redis.url:
            return
        if self.settings.semantic.sync:
            self._sync = RedisSync.from_settings(self.stage, redis)
            self._sync.writes = self.writes
        if self.budgets():
            # Shared and durable counts whenever Redis is configured, with or without a shared
            # index: on the sync's publishing client (one client set per process), or a client
            # of its own when the index is not shared.
            if self._sync is not None:
                client = self._sync.redis
            else:
                client = connect(
                    redis, socket_timeout=max(redis.timeouts.op, 0.5), max_connections=4
                )
                self._owned_redis = client
            # Both write every flush: only while the exact tier's write breaker lets writes go
            self._budget_store = BudgetStore(client, self.budgets(), redis.key_prefix)
            self._budget_store.writes = self.writes
            if any(b.guard is not None for b in self.budgets().values()):
                self._tenant_labels = TenantLabelShare(client, self.budgets(), redis.key_prefix)
                self._tenant_labels.writes = self.writes

    async def _open_cross_encoder(self) -> None:
        """One cross-encoder per process, shared by the routes whose verifier uses it."""
        users = [
            r.verifier for r in self.routes.values() if isinstance(r.verifier, CrossEncoderVerifier)
        ]
        if not users:
            return
        s = self.settings.semantic
        model = await asyncio.to_thread(
            CrossEncoder.load,
            users[0].artifact,
            artifacts_dir=s.artifacts_dir,
            providers=s.providers,
            threads=s.cross_encoder_threads,
        )
        took = await asyncio.to_thread(model.warmup)
        for v in users:
            v.attach(model)
        self._cross_encoder = model
        log.info(
            "semantic verifier: cross-encoder (%s layers) on %s, warm in %.0f ms",
            model.meta.get("layers"),
            model.device,
            took * 1e3,
        )

    async def purge(self, selector: Selector) -> int:
        """Remove the vectors whose exact entries a purge removed."""
        keys = [e.exact_key for e in self.stage.entries.values() if selector.matches(e.exact_key)]
        for k in keys:
            await self.stage.remove_key(k)
        return len(keys)

    async def aclose(self) -> None:
        # A load still building the embedder's model ends (the process would wait for it);
        # one past that finishes in its thread, and its result is dropped.
        self.progress.stop()
        if self._task is not None and not self._task.done():
            # First: an open() still starting must not start what is closed below.
            await stop_task(self._task)
        if self._budget_store is not None:
            await self._budget_store.aclose()
        if self._tenant_labels is not None:
            await self._tenant_labels.aclose()
        for b in self.budgets().values():
            await b.aclose()
        if self._sync is not None:
            await self._sync.aclose()
        if self._owned_redis is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._owned_redis.aclose()
        await self.stage.embedder.aclose()
        if self._cross_encoder is not None:
            self._cross_encoder.close()


def build_semantic(
    settings: CacheSettings,
    registry: CollectorRegistry,
    routes: Sequence[RouteLike],
    engine_metrics: Callable[[], Any] | None = None,
    engines: Any = None,
    backend_named: BackendNamed | None = None,
) -> SemanticSetup | None:
    enabled = [r for r in routes if r.cache.semantic.enabled]
    if not enabled:
        return None
    return SemanticSetup(settings, registry, enabled, engine_metrics, engines, backend_named)


def semantic_routes(setup: SemanticSetup | None) -> Mapping[str, SemanticRoute]:
    return {} if setup is None else setup.routes
