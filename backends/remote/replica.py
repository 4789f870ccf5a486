"""Replica: one endpoint of a pool and what the pool knows about it (load, latency, health).

Pure state and arithmetic; the balancer reads it, the outlier detector and health checks write it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.remote.transports.base import Transport

_EWMA_ALPHA = 0.2
# A returning replica starts at this share of its weight and ramps up linearly over slow start.
_SLOW_START_FLOOR = 0.1


@dataclass(eq=False)
class Replica:
    url: str
    transport: Transport
    weight: float = 1.0
    outstanding: int = 0
    healthy: bool = True  # the active health check's view
    ejected_until: float = 0.0  # monotonic; 0 when not ejected
    ejections: int = 0  # Envoy's multiplier: grows per ejection, decays while healthy
    consecutive_errors: int = 0
    ewma_latency_s: float = 0.0
    samples: int = 0  # latency samples since the replica (re)joined
    error_rate: float = 0.0  # EWMA of 0/1 per response
    slow_start_from: float = 0.0
    decay_at: float = 0.0  # when the ejection multiplier next shrinks while healthy
    health_passes: int = 0
    health_fails: int = 0
    # Whether this replica ever answered (a request or a health check): one never reached is not
    # reported healthy, even though the balancer still tries it.
    reached: bool = False
    _ring_tokens: list[int] = field(default_factory=list)

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def available(self, now: float) -> bool:
        return self.healthy and not self.ejected(now)

    def load_factor(self, now: float, slow_start_s: float) -> float:
        """Weight multiplier in (0, 1]: below 1 only during slow start after rejoining."""
        if slow_start_s <= 0 or self.slow_start_from <= 0:
            return 1.0
        elapsed = now - self.slow_start_from
        if elapsed >= slow_start_s:
            return 1.0
        return max(_SLOW_START_FLOOR, elapsed / slow_start_s)

    def observe(self, latency_s: float | None, failed: bool) -> None:
        if latency_s is not None:
            if self.samples == 0:
                self.ewma_latency_s = latency_s
            else:
                self.ewma_latency_s += _EWMA_ALPHA * (latency_s - self.ewma_latency_s)
            self.samples += 1
        self.error_rate += _EWMA_ALPHA * ((1.0 if failed else 0.0) - self.error_rate)
        self.consecutive_errors = self.consecutive_errors + 1 if failed else 0

    def stream_done(self) -> None:
        self.outstanding -= 1

    def rejoin(self, now: float) -> None:
        """Back in rotation: forget the old latency and ramp traffic up again."""
        self.ejected_until = 0.0
        self.consecutive_errors = 0
        self.samples = 0
        self.slow_start_from = now

    def state(self, now: float) -> str:
        """What /readyz shows: ejected, unhealthy (failing its health check), unknown (never
        tried), unreachable (never reached), failing (its last answers were errors) or healthy."""
        if self.ejected(now):
            return "ejected"
        if not self.healthy:
            return "unhealthy"
        if not self.reached:
            return "unreachable" if self.consecutive_errors else "unknown"
        return "failing" if self.consecutive_errors else "healthy"

    def describe(self, now: float) -> dict[str, object]:
        ejected = self.ejected(now)
        state = self.state(now)
        return {
            "url": self.url,
            "state": state,
            "healthy": state == "healthy",
            "ejected": ejected,
            "ejected_until_unix": (time.time() + self.ejected_until - now) if ejected else None,
            "ejections": self.ejections,
            "outstanding": self.outstanding,
            "ewma_latency_ms": round(self.ewma_latency_s * 1000, 3),
            "error_rate": round(self.error_rate, 4),
            "consecutive_errors": self.consecutive_errors,
            "weight": self.weight,
            "pool": self.transport.pool_stats(),
        }
