"""Cache metrics on the app's own Prometheus registry; label children cached for the hot path."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LOOKUP_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.lookups = Counter(
            "latentgate_cache_lookups",
            "Exact-cache outcomes per route and tier (result: hit, miss, bypass)",
            ["route", "tier", "result"],
            registry=r,
        )
        self.lookup_latency = Histogram(
            "latentgate_cache_lookup_duration_seconds",
            "Exact-cache lookup time per tier",
            ["tier"],
            buckets=LOOKUP_BUCKETS,
            registry=r,
        )
        self.stores = Counter(
            "latentgate_cache_stores",
            "Entries written per tier and outcome",
            ["tier", "result"],
            registry=r,
        )
        self.evictions = Counter(
            "latentgate_cache_evictions", "Entries evicted for space per tier", ["tier"], registry=r
        )
        self.decode_errors = Counter(
            "latentgate_cache_decode_errors",
            "Stored entries that did not decode (treated as a miss and deleted)",
            ["tier"],
            registry=r,
        )
        self.redis_errors = Counter(
            "latentgate_cache_redis_errors",
            "Redis operations that failed or timed out",
            ["op", "kind"],
            registry=r,
        )
        self.purges_waiting = Gauge(
            "latentgate_cache_redis_purges_waiting",
            "Admin purges whose Redis part failed: this process reads no key they match from"
            " Redis, and runs them again once it answers (cache.tiers.redis_purges)",
            registry=r,
        )
        self.purges_forgotten = Counter(
            "latentgate_cache_redis_purges_forgotten",
            "Waiting purges forgotten past the cap (their entries live in Redis until their TTL)",
            registry=r,
        )
        self.stream_gaps = Counter(
            "latentgate_cache_stream_gaps",
            "Times a stream tail found that events it had not read were trimmed (it was cut off"
            " from Redis or behind for longer than the stream holds; cache.stream_gap): purge"
            " drops the memory tier, semantic rebuilds its index from Redis",
            ["stream"],
            registry=r,
        )
        self.stream_skips = Counter(
            "latentgate_cache_stream_events_skipped",
            "Stream records a tail could not apply and read on past (junk written with XADD,"
            " another version's layout, an apply that failed other than on Redis)",
            ["stream"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "latentgate_cache_redis_breaker_state",
            "Redis breaker: 0 closed, 1 open (Redis skipped), 2 half-open (probing)",
            registry=r,
        )
        self.write_breaker_state = Gauge(
            "latentgate_cache_redis_write_breaker_state",
            "Redis write breaker: 0 closed, 1 open (writes skipped: Redis stalled them while"
            " reads answered), 2 half-open (probing with one write)",
            registry=r,
        )
        self.undeleted = Gauge(
            "latentgate_cache_redis_undeleted_keys",
            "Keys whose delete has not reached Redis yet (Redis slow or marked down): this"
            " process reads none of them from Redis, and deletes them once it answers",
            registry=r,
        )
        self.undeleted_forgotten = Counter(
            "latentgate_cache_redis_undeleted_forgotten",
            "Undelivered deletes forgotten past the cap (those entries live until their TTL)",
            registry=r,
        )
        self.bytes = Gauge("latentgate_cache_bytes", "Bytes held per tier", ["tier"], registry=r)
        self.entries = Gauge(
            "latentgate_cache_entries", "Entries held per tier", ["tier"], registry=r
        )
        self.waiters = Gauge(
            "latentgate_cache_singleflight_waiters",
            "Requests waiting on an identical in-flight miss",
            registry=r,
        )
        self.coalesced = Counter(
            "latentgate_cache_singleflight_coalesced",
            "Requests that waited on another request's backend call, by outcome: shared (it"
            " answered them), followed (they were sent its stream as it came), unusable (its"
            " answer was private or not for them: they computed), error, timeout",
            ["outcome"],
            registry=r,
        )
        self._lookup_children: dict[tuple[str, str, str], Counter] = {}
        self._latency_children: dict[str, Histogram] = {}

    def lookup(self, route: str, tier: str, result: str) -> None:
        key = (route, tier, result)
        child = self._lookup_children.get(key)
        if child is None:
            child = self._lookup_children[key] = self.lookups.labels(route, tier, result)
        child.inc()

    def observe_latency(self, tier: str, seconds: float) -> None:
        child = self._latency_children.get(tier)
        if child is None:
            child = self._latency_children[tier] = self.lookup_latency.labels(tier)
        child.observe(seconds)

    def watch(self, tier: str, entries: Callable[[], float], nbytes: Callable[[], float]) -> None:
        self.entries.labels(tier).set_function(entries)
        self.bytes.labels(tier).set_function(nbytes)
