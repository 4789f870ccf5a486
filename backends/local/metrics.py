"""Prometheus metrics for local engines and their batchers, on a registry the caller passes in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_DELAY_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
_RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


class LocalMetrics:
    """One set per registry: several engines share it through the `model` label."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_size = Histogram(
            "latentgate_batch_size",
            "Items per engine run",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.queue_delay = Histogram(
            "latentgate_batch_queue_delay_seconds",
            "Time an item waited before its batch ran",
            ["model"],
            buckets=_DELAY_BUCKETS,
            registry=registry,
        )
        self.padding_ratio = Histogram(
            "latentgate_batch_padding_ratio",
            "Share of a batch's token slots that are padding",
            ["model"],
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )
        self.run_seconds = Histogram(
            "latentgate_engine_run_seconds",
            "Engine time per batch",
            ["model"],
            buckets=_DELAY_BUCKETS,
            registry=registry,
        )
        self.wait_target = Gauge(
            "latentgate_batch_wait_seconds",
            "Current batching wait chosen by the batcher",
            ["model"],
            registry=registry,
        )
        self.engine_info = Gauge(
            "latentgate_engine_info",
            "Local engines: the device and provider each one runs on",
            ["model", "engine", "device", "provider"],
            registry=registry,
        )
        self.sessions = Counter(
            "latentgate_engine_sessions_loaded",
            "Inference sessions loaded per model (holders of one model share one session)",
            ["model"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "latentgate_engine_fallbacks",
            "Engines that fell back from the device they asked for",
            ["model", "wanted", "got"],
            registry=registry,
        )
