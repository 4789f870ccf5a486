"""Prometheus metrics of the semantic stage, registered on the app's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.05, 0.2)
_SIM_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.99, 1.0)


class SemanticMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "latentgate_semantic_"
        self.lookups = Counter(
            p + "lookups",
            "Semantic lookups by result (hit, miss, stale, contested; hit: also a paraphrase"
            " served by an equivalent miss in flight)",
            ["result"],
            registry=registry,
        )
        self.refusals = Counter(
            p + "verifier_refusals", "Candidates the verifier turned down", registry=registry
        )
        self.similarity = Histogram(
            p + "similarity",
            "Best candidate cosine per lookup",
            buckets=_SIM_BUCKETS,
            registry=registry,
        )
        self.latency = Histogram(
            p + "stage_seconds",
            "Semantic lookup time by step",
            ["step"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.size = Gauge(p + "index_entries", "Vectors in the local index", registry=registry)
        self.index_bytes = Gauge(
            p + "index_bytes",
            "Estimated bytes of the local semantic index (entries and vectors; the figure "
            "cache.semantic.max_bytes bounds)",
            registry=registry,
        )
        self.device = Gauge(
            p + "device_info",
            "Where the embedder and the index run (1 = in use)",
            ["embedder", "index"],
            registry=registry,
        )
        self.feedback = Counter(
            p + "wrong_hit_reports", "Client reports of a wrong semantic hit", registry=registry
        )
        self.sync = Counter(
            p + "sync_events",
            "Replication events by direction and outcome",
            ["direction", "outcome"],
            registry=registry,
        )
        # Error budget (routes with cache.semantic.max_error_rate), per route.
        self.audits = Counter(
            p + "audits",
            "Audited semantic hits by outcome (agree, disagree, unusable, error; too_large: the"
            " upstream's answer was over max_entry_bytes, not read past it, no label)",
            ["route", "outcome"],
            registry=registry,
        )
        self.labels = Counter(
            p + "labels",
            "Labelled candidates by source (miss, audit) and outcome (agree, disagree; unusable:"
            " an answer or verdict that could not be compared, no label; shed: not attempted,"
            " too many in flight)",
            ["route", "source", "outcome"],
            registry=registry,
        )
        self.error_rate = Gauge(
            p + "error_rate",
            "Labelled error rate of the served region: estimate, its upper bound, the budget",
            ["route", "stat"],
            registry=registry,
        )
        self.bar = Gauge(
            p + "bar",
            "The learned serving bar: cosine and score, or cosine_only (1.01: none / closed)",
            ["route", "dim"],
            registry=registry,
        )
        self.prior_scale = Gauge(
            p + "prior_scale",
            "How much more often the route's own labels are wrong than the shipped prior says"
            " (its wrong counts are scaled by this; 1: as the prior says)",
            ["route"],
            registry=registry,
        )
        self.bar_open = Gauge(
            p + "bar_open",
            "1 while a proven bar serves hits, 0 while learning",
            ["route"],
            registry=registry,
        )
        self.guarded_tenants = Gauge(
            p + "guarded_tenants",
            "Tenants whose own labels refute this route's bar (or, while it is closed, the"
            " region it starts from): served no semantic hit, their labels kept apart"
            " (cache.semantic.tenant_guard)",
            ["route"],
            registry=registry,
        )
        self.closed_reason = Gauge(
            p + "bar_closed_reason",
            "1 for why a closed bar is closed (too_few_labels, bound_over_budget, refuted),"
            " said of the shipped point's region; all 0 while the bar serves",
            ["route", "reason"],
            registry=registry,
        )
