"""Per-app Prometheus registry (prefix latentgate_) with cached label children for the hot path."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class _PoolCollector(Collector):
    def __init__(self, source: Callable[[], dict[str, dict[str, dict[str, int]]]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        fam = GaugeMetricFamily(
            "latentgate_upstream_connections",
            "Upstream pool connections by state (idle, in_use) and the pool limit",
            labels=["backend", "replica", "state"],
        )
        for backend, replicas in self._source().items():
            for replica, stats in replicas.items():
                for state, value in stats.items():
                    fam.add_metric([backend, replica, state], value)
        yield fam


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "latentgate_requests",
            "Requests by route, backend and status",
            ["route", "backend", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "latentgate_request_duration_seconds",
            "Time to the last byte, per route and backend",
            ["route", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "latentgate_upstream_duration_seconds",
            "Time to upstream response headers",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("latentgate_in_flight_requests", "Requests being served", registry=r)
        self.upstream_errors = Counter(
            "latentgate_upstream_errors",
            "Upstream failures by kind",
            ["backend", "kind"],
            registry=r,
        )
        self._children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}

    def add_pool_source(self, source: Callable[[], dict[str, dict[str, dict[str, int]]]]) -> None:
        self.registry.register(_PoolCollector(source))

    def observe_request(self, route: str, backend: str, status: int, seconds: float) -> None:
        key = (route, backend, str(status))
        child = self._children.get(key)
        if child is None:
            child = (self.requests.labels(*key), self.latency.labels(route, backend))
            self._children[key] = child
        child[0].inc()
        child[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
