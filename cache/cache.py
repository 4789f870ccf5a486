"""The exact-cache facade the pipeline calls: the tiers, purge, stats, and one RouteCache per
route (cache.route_cache: keys, lookup, single flight, store, invalidation).

One Cache owns the tiers (L1 memory, optional L2 Redis) and the purge fan-out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry

from cache.breaker import OPEN
from cache.errors import TierError
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.purge_fanout import PurgeFanout
from cache.route_cache import RouteCache
from cache.settings import CacheSettings, ExactPolicy
from cache.singleflight import SingleFlight
from cache.tenant import TenantHasher, resolve_secret
from cache.tiers.layered import LayeredTier
from cache.tiers.memory import MemoryTier
from cache.tiers.redis import RedisTier

log = logging.getLogger("latentgate.cache")


class Cache:
    def __init__(self, settings: CacheSettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.metrics = CacheMetrics(registry)
        self.tenants = TenantHasher(resolve_secret(settings.tenant_secret))
        self.memory = MemoryTier(settings.memory.max_bytes, self.metrics)
        redis = settings.redis
        self.redis = RedisTier(redis, self.metrics) if redis is not None and redis.url else None
        # other sidecars on this Redis drop what a purge here removes from their memory tier
        self.fanout = (
            PurgeFanout.from_settings(
                redis,
                self._apply_announced,
                lambda kind: self.metrics.redis_errors.labels("purge_fanout", kind).inc(),
                self.metrics.stream_gaps.labels("purge").inc,
                self.metrics.stream_skips.labels("purge").inc,
            )
            if redis is not None and self.redis is not None
            else None
        )
        if self.redis is not None and self.fanout is not None:
            self.redis.on_late_delete = self._announce_late
            self.redis.purges.on_late_purge = self._announce_late_purge
        self.flights: SingleFlight[Any] = SingleFlight(self.metrics)
        self.counts = {"lookups": 0, "memory": 0, "redis": 0, "misses": 0, "bypasses": 0}
        self.routes: dict[str, RouteCache] = {}
        # --workers N: tells the sibling workers' memory tiers of a purge (and, without Redis,
        # of an invalidation's one key), and returns what each did once they have answered
        # (gateway.worker_drops)
        self.siblings: Callable[[Selector], Awaitable[dict[str, int | str]]] | None = None
        # Called with each purge's selector (the semantic index drops the matching vectors).
        self.purge_listeners: list[Callable[[Selector], Awaitable[object]]] = []

    def for_route(
        self, name: str, policy: ExactPolicy, upstream: str = "", keyed: Iterable[str] = ()
    ) -> RouteCache | None:
        """The route's cache, or None when its exact cache is off. upstream: what its answers
        come from (keys.key_scope); keyed: the request headers its adapter puts in its keys."""
        if not policy.enabled:
            return None
        l1 = self.memory if "memory" in policy.tiers else None
        l2 = self.redis if "redis" in policy.tiers else None
        rc = RouteCache(self, name, policy, LayeredTier(l1, l2, self.metrics), upstream, keyed)
        self.routes[name] = rc
        return rc

    async def open(self) -> None:
        if self.fanout is not None and self.redis is not None:
            await self.fanout.prime(self.redis.settings.timeouts.connect * 2)
            self.fanout.start()
        if self.redis is not None:
            self.redis.resume()
            log.info("exact cache: memory (%d bytes) + redis", self.memory.max_bytes)
        else:
            log.info(
                "exact cache: memory only (%d bytes); no redis configured", self.memory.max_bytes
            )

    async def aclose(self) -> None:
        if self.redis is not None:
            self.redis.on_late_delete = None  # the fan-out closes first
            self.redis.purges.on_late_purge = None
        if self.fanout is not None:
            await self.fanout.aclose()
        await self.memory.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    async def _apply_announced(self, selector: Selector, pending: bool) -> int:
        """Another process's purge or invalidation. Pending: its delete of that one key was
        not confirmed, so the old entry may still be in Redis: this process reads none of it
        from there until its own delete lands (remembered before the memory tier lets go)."""
        if pending and self.redis is not None:
            if selector.key is not None:
                self.redis.redo(selector.key, announce=False)
            else:  # a purge whose Redis part failed there: kept from Redis here, and run
                self.redis.purges.add(selector, announce=False)
        return await self.memory.purge(selector)

    async def _announce_late(self, keys: list[str]) -> None:
        """Deletes that reached Redis late (cache.tiers.undeleted): the other processes drop
        those entries from their memory tiers too, as a timely invalidation has them do (its
        announcement is skipped while Redis is marked down). Sent together: the fan-out's
        slots bound how many at once."""
        fanout, redis = self.fanout, self.redis
        assert fanout is not None and redis is not None
        sends = []
        for key in keys:
            selector = Selector.of_value(key)
            if selector is not None:  # (one that fails is kept for the next round)
                sends.append(fanout.announce(selector, on_failure=partial(redis.redo, key)))
        await asyncio.gather(*sends)

    async def purge(
        self, route: str | None = None, model: str | None = None, tenant: str | None = None
    ) -> dict[str, object]:
        # tenant: an identity string (cache.tenant.tenant_of), hashed as this cache's keys are
        selector = Selector.of(route, model, tenant, self.tenants)
        removed = await self.memory.purge(selector)
        out: dict[str, object] = {"memory": removed}
        for listener in self.purge_listeners:
            out.setdefault("semantic", await listener(selector))
        if self.redis is not None:
            where: dict[str, int] = {}
            try:
                out["redis"] = await self.redis.purge(selector, where)
            except TierError as exc:
                # kept from being read back, and run again once Redis answers (then announced),
                # from where this try stopped
                self.redis.purges.add(selector, where=where)
                out["redis"] = {"error": str(exc), "retrying": True}
        # A Redis read that answered while Redis was being purged may have put back what the
        # purge removes: a second pass drops it, and bumps the generation again, so a read or
        # an upstream answer still in flight is not kept either (LayeredTier.lookup,
        # RouteCache.store).
        out["memory"] = removed + await self.memory.purge(selector)
        if self.siblings is not None:  # after Redis: a sibling told first could read it back
            out["other_workers"] = await self.siblings(selector)
        if self.fanout is not None and self.redis is not None:
            out["other_processes"] = await self._announce_purge(
                self.fanout, self.redis, selector, isinstance(out.get("redis"), dict)
            )
        return out

    async def _announce_purge(
        self, fanout: PurgeFanout, redis: RedisTier, selector: Selector, pending: bool
    ) -> str:
        """What the admin answer says of the other processes. `pending`: the purge's Redis part
        waits here, so the others keep it from Redis and run it too (Cache._apply_announced).
        Not sent while Redis, or its writes, are marked down: the XADD would stall as the purge
        did, and the operator's answer waited out the fan-out client's socket timeout (1.75 s by
        default, per purge, for as long as the stall lasted). Otherwise awaited within one op
        deadline, the rest sent on in the background. One not sent, or that fails, is never
        lost: the waiting purge announces it once it lands (run again for that when its Redis
        part had landed)."""
        again = None if pending else partial(redis.purges.add, selector)
        if redis.breaker.state == OPEN or redis.writes.state == OPEN:
            fanout.skipped("Redis marked down")
            if again is not None:
                again()
            return "not announced: Redis writes are marked down; announced once the purge lands"
        return await fanout.announce(
            selector, redis.settings.timeouts.op, on_failure=again, pending=pending
        )

    async def _announce_late_purge(self, selector: Selector) -> None:
        """A purge whose Redis part (or announcement) failed reached Redis at last: the other
        processes' memory tiers may hold what it removes (read from Redis before it landed)."""
        fanout, redis = self.fanout, self.redis
        assert fanout is not None and redis is not None
        if (await fanout.announce(selector)).startswith("not announced"):
            redis.purges.add(selector)

    async def stats(self) -> dict[str, object]:
        c = self.counts
        lookups = c["lookups"]
        past_l1 = lookups - c["memory"]
        tiers: dict[str, object] = {
            "memory": {
                **(await self.memory.stats()),
                "hits": c["memory"],
                "hit_ratio": c["memory"] / lookups if lookups else 0.0,
            }
        }
        if self.redis is not None:
            tiers["redis"] = {
                **(await self.redis.stats()),
                "hits": c["redis"],
                "hit_ratio": c["redis"] / past_l1 if past_l1 else 0.0,
            }
        hits = c["memory"] + c["redis"]
        return {
            "lookups": lookups,
            "hits": hits,
            "misses": c["misses"],
            "bypasses": c["bypasses"],
            "hit_ratio": hits / lookups if lookups else 0.0,
            "in_flight": self.flights.in_flight(),
            "tiers": tiers,
        }
