"""Prometheus metrics for every pool decision, registered on the registry the app hands in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RemoteMetrics:
    """One set per app (names are unique per registry); every pool labels by its backend name."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = r
        self.picks = Counter(
            "latentgate_upstream_picks",
            "Replica picks by the balancer (every attempt)",
            ["backend", "replica"],
            registry=r,
        )
        self.ejections = Counter(
            "latentgate_upstream_ejections",
            "Outlier ejections by reason",
            ["backend", "replica", "reason"],
            registry=r,
        )
        self.ejected = Gauge(
            "latentgate_upstream_replica_ejected",
            "1 while a replica is ejected",
            ["backend", "replica"],
            registry=r,
        )
        self.healthy = Gauge(
            "latentgate_upstream_replica_healthy",
            "Active health check state (1 healthy)",
            ["backend", "replica"],
            registry=r,
        )
        self.retries = Counter(
            "latentgate_upstream_retries",
            "Retries by outcome (sent, budget_denied, retry_after_past_deadline)",
            ["backend", "outcome"],
            registry=r,
        )
        self.hedges = Counter(
            "latentgate_upstream_hedges",
            "Hedged attempts by outcome (sent, won, budget_denied)",
            ["backend", "outcome"],
            registry=r,
        )
        self.breaker_rejections = Counter(
            "latentgate_upstream_breaker_rejections",
            "Requests the circuit breaker refused, by limit (a fast 503; queue_deadline: a 504 for "
            "one queued for a slot past its deadline)",
            ["backend", "limit"],
            registry=r,
        )
        self.health_checks = Counter(
            "latentgate_upstream_health_checks",
            "Active health checks by result",
            ["backend", "replica", "result"],
            registry=r,
        )
