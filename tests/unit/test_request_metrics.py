"""The request counter and latency histogram are counted by hand (gateway/metrics.py) for the
hot path; a scrape must read exactly what prometheus_client's Counter and Histogram would show."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import LATENCY_BUCKETS, Metrics

OBSERVED = [
    ("openai-chat", "upstream", 200, 0.0002),  # exactly on a bucket bound
    ("openai-chat", "upstream", 200, 0.00031),
    ("openai-chat", "upstream", 502, 0.7),
    ("default", "upstream", 404, 0.0),
    ("default", "-", 404, 75.0),  # past the last bound: +Inf only
]


def _reference() -> bytes:
    r = CollectorRegistry()
    requests = Counter(
        "latentgate_requests",
        "Requests by route, backend and status",
        ["route", "backend", "status"],
        registry=r,
    )
    latency = Histogram(
        "latentgate_request_duration_seconds",
        "Time to the last byte, per route and backend",
        ["route", "backend"],
        buckets=LATENCY_BUCKETS,
        registry=r,
    )
    for route, backend, status, seconds in OBSERVED:
        requests.labels(route, backend, str(status)).inc()
        latency.labels(route, backend).observe(seconds)
    return generate_latest(r)


def _without_created_values(text: bytes) -> list[str]:
    lines = text.decode().splitlines()
    return [re.sub(r"(_created\{.*\}) .*", r"\1", x) for x in lines]


def test_scrape_matches_prometheus_client_counter_and_histogram() -> None:
    m = Metrics()
    for route, backend, status, seconds in OBSERVED:
        m.observe_request(route, backend, status, seconds)
    ours = _without_created_values(m.render())
    want = _without_created_values(_reference())
    # ours also holds the other metrics; the two families must read line for line the same
    start = ours.index(want[0])
    assert ours[start : start + len(want)] == want


def test_counts_add_up_per_label_set() -> None:
    m = Metrics()
    for _ in range(3):
        m.observe_request("r", "b", 200, 0.001)
    reg = m.registry
    assert (
        reg.get_sample_value(
            "latentgate_requests_total", {"route": "r", "backend": "b", "status": "200"}
        )
        == 3
    )
    assert (
        reg.get_sample_value(
            "latentgate_request_duration_seconds_bucket",
            {"route": "r", "backend": "b", "le": "0.0005"},
        )
        == 0
    )
    assert (
        reg.get_sample_value(
            "latentgate_request_duration_seconds_count", {"route": "r", "backend": "b"}
        )
        == 3
    )
