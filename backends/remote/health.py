"""Replica health: active checks (a cheap GET per replica) and passive outlier ejection.

Ejection follows Envoy: consecutive errors (5xx, connect failures) or a latency outlier eject a
replica for base x (times ejected), capped; never more than max_ejection_percent of the pool
(at least one when the share is > 0 and the pool has two or more), and never the whole pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable

from backends.base import BodyTooLarge, UpstreamRequest
from backends.errors import BackendError
from backends.remote.metrics import RemoteMetrics
from backends.remote.replica import Replica
from backends.settings import HealthCheckSettings, OutlierSettings

log = logging.getLogger("latentgate.backends.health")
# A health check's body, at most (a status page, a JSON "ok"): more is not read, the connection
# is closed instead, and the status alone decides.
HEALTH_BODY_CAP = 64 << 10


def max_ejected(pool_size: int, percent: float) -> int:
    if percent <= 0 or pool_size < 2:
        return 0
    return min(pool_size - 1, max(1, math.floor(pool_size * percent / 100.0)))


class OutlierDetector:
    def __init__(
        self,
        backend: str,
        replicas: list[Replica],
        settings: OutlierSettings,
        metrics: RemoteMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._replicas = replicas
        self._s = settings
        self._metrics = metrics
        self._clock = clock

    def on_result(self, r: Replica, failed: bool, latency_s: float | None) -> None:
        r.observe(latency_s, failed)
        if failed and self._s.enabled and r.consecutive_errors >= self._s.consecutive_errors:
            self.eject(r, "consecutive_errors")

    def eject(self, r: Replica, reason: str) -> bool:
        now = self._clock()
        if r.ejected(now):
            return False
        ejected = sum(1 for x in self._replicas if x.ejected(now))
        if ejected >= max_ejected(len(self._replicas), self._s.max_ejection_percent):
            return False
        r.ejections += 1
        duration = min(self._s.max_ejection_s, self._s.base_ejection_s * r.ejections)
        r.ejected_until = now + duration
        r.consecutive_errors = 0
        self._metrics.ejections.labels(self._backend, r.url, reason).inc()
        self._metrics.ejected.labels(self._backend, r.url).set(1)
        log.warning("%s: ejected %s for %.1fs (%s)", self._backend, r.url, duration, reason)
        return True

    def sweep(self) -> None:
        """Return replicas whose ejection ran out, decay multipliers, eject latency outliers."""
        now = self._clock()
        for r in self._replicas:
            if r.ejected_until and r.ejected_until <= now:
                self.rejoin(r, now)
            elif r.ejections and not r.ejected_until and now >= r.decay_at:
                r.ejections -= 1
                r.decay_at = now + self._s.base_ejection_s
        if self._s.enabled and self._s.latency_factor is not None:
            self._latency_outliers(now, self._s.latency_factor)

    def rejoin(self, r: Replica, now: float) -> None:
        r.rejoin(now)
        r.decay_at = now + self._s.base_ejection_s
        self._metrics.ejected.labels(self._backend, r.url).set(0)
        log.info(
            "%s: %s back in rotation (slow start %.1fs)", self._backend, r.url, self._s.slow_start_s
        )

    def _latency_outliers(self, now: float, factor: float) -> None:
        ready = [
            r
            for r in self._replicas
            if r.available(now) and r.samples >= self._s.latency_min_samples
        ]
        if len(ready) < 2:
            return
        for r in ready:
            ref = statistics.median(x.ewma_latency_s for x in ready if x is not r)
            excess_ms = (r.ewma_latency_s - ref) * 1000
            if r.ewma_latency_s > factor * ref and excess_ms >= self._s.latency_min_excess_ms:
                self.eject(r, "latency")


class HealthChecker:
    """Every interval, GET the configured path on each replica; thresholds flip its state."""

    def __init__(
        self,
        backend: str,
        replicas: list[Replica],
        settings: HealthCheckSettings,
        metrics: RemoteMetrics,
        on_healthy: Callable[[Replica], None],
    ) -> None:
        self._backend = backend
        self._replicas = replicas
        self._s = settings
        self._metrics = metrics
        self._on_healthy = on_healthy

    async def check(self, r: Replica) -> bool:
        req = UpstreamRequest("GET", self._s.path, [("User-Agent", "latentgate-health")])
        req.deadline_s = self._s.timeout_s
        try:
            async with asyncio.timeout(self._s.timeout_s):
                resp = await r.transport.send(req)
                # the status decides; the body is read only so the connection can be reused,
                # and past a small cap not at all (closed instead): a replica (or a URL that
                # points at a file server) sending an endless body must not be held in memory
                with contextlib.suppress(BodyTooLarge):
                    await resp.read_capped(HEALTH_BODY_CAP)
            ok = 200 <= resp.status < 300
        except (BackendError, TimeoutError):
            ok = False
        self._metrics.health_checks.labels(self._backend, r.url, "pass" if ok else "fail").inc()
        self._apply(r, ok)
        return ok

    def _apply(self, r: Replica, ok: bool) -> None:
        if ok:
            r.reached = True
            r.health_passes, r.health_fails = r.health_passes + 1, 0
            if not r.healthy and r.health_passes >= self._s.healthy_threshold:
                r.healthy = True
                self._metrics.healthy.labels(self._backend, r.url).set(1)
                log.info("%s: %s passed its health check", self._backend, r.url)
                self._on_healthy(r)
        else:
            r.health_fails, r.health_passes = r.health_fails + 1, 0
            if r.healthy and r.health_fails >= self._s.unhealthy_threshold:
                r.healthy = False
                self._metrics.healthy.labels(self._backend, r.url).set(0)
                log.warning("%s: %s failed its health check", self._backend, r.url)

    async def run(self) -> None:
        while True:
            await asyncio.gather(*(self.check(r) for r in self._replicas))
            await asyncio.sleep(self._s.interval_s)
