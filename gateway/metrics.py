"""Per-app Prometheus registry (prefix latentgate_) with cached label children for the hot path."""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


class _RequestStats(Collector):
    """latentgate_requests_total and latentgate_request_duration_seconds, exposed exactly as a
    prometheus_client Counter and Histogram would (same names, labels, buckets, _created), but
    counted in plain lists: a request costs one bisect and three additions instead of three
    lock-taking increments and a Python loop over the buckets. Only the event loop's thread
    writes; a scrape reads on the same thread."""

    def __init__(self) -> None:
        self._bounds = [float(b) for b in LATENCY_BUCKETS]
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.counts: dict[tuple[str, str, str], list[float]] = {}  # key -> [count, created]
        # (route, backend) -> [bucket counts..., +Inf count, sum, created]
        self.latency: dict[tuple[str, str], list[float]] = {}
        # prometheus_client's own switch for the _created series
        flag = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower()
        self._created = flag not in ("true", "1", "t")

    def observe(self, key: tuple[str, str, str], seconds: float) -> None:
        count = self.counts.get(key)
        if count is None:
            count = self.counts[key] = [0.0, time.time()]
        count[0] += 1
        hist = self.latency.get(key[:2])
        if hist is None:
            hist = self.latency[key[:2]] = [0.0] * (len(self._les) + 1) + [time.time()]
        hist[bisect_left(self._bounds, seconds)] += 1
        hist[-2] += seconds

    def collect(self) -> Iterable[Metric]:
        requests = Metric("latentgate_requests", "Requests by route, backend and status", "counter")
        for (route, backend, status), (value, created) in self.counts.items():
            labels = {"route": route, "backend": backend, "status": status}
            requests.add_sample("latentgate_requests_total", labels, value)
            if self._created:
                requests.add_sample("latentgate_requests_created", labels, created)
        yield requests
        name = "latentgate_request_duration_seconds"
        latency = Metric(name, "Time to the last byte, per route and backend", "histogram")
        for (route, backend), hist in self.latency.items():
            labels = {"route": route, "backend": backend}
            total = 0.0
            for le, n in zip(self._les, hist, strict=False):
                total += n
                latency.add_sample(name + "_bucket", {**labels, "le": le}, total)
            latency.add_sample(name + "_count", labels, total)
            latency.add_sample(name + "_sum", labels, hist[-2])
            if self._created:
                latency.add_sample(name + "_created", labels, hist[-1])
        yield latency


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = _RequestStats()
        r.register(self._requests)
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

    def add_pool_source(self, source: Callable[[], dict[str, dict[str, dict[str, int]]]]) -> None:
        self.registry.register(_PoolCollector(source))

    def observe_request(self, route: str, backend: str, status: int, seconds: float) -> None:
        self._requests.observe((route, backend, str(status)), seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
