"""Why a Redis that answers refuses writes (and serves reads), and what to do about it: such a
Redis is no outage (cache.tiers.redis keeps its breaker closed and logs it once a spell)."""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

_STORED = "answers are not stored there, reads go on"


def refusal(exc: ResponseError) -> str | None:
    """Why a Redis that answers refuses writes, and what to do about it; None: another error."""
    if isinstance(exc, OutOfMemoryError):
        return (
            f"Redis is full and its maxmemory-policy evicts nothing: {_STORED}; raise"
            " maxmemory or set an allkeys-* policy"
        )
    if isinstance(exc, ReadOnlyError):
        return (
            f"This Redis is a read-only replica (a failover demoted it?): {_STORED}; point"
            " cache.redis.url at the primary, or use sentinel mode, which follows failovers"
        )
    if str(exc).startswith(("MISCONF", "NOREPLICAS")):
        return f"Redis refuses writes until it can snapshot or reach its replicas: {_STORED}"
    return None
