"""One route's exact cache: its key builder, tier stack and policy resolved once, so the hit
path does no setup work; lookup, store, invalidation and the Redis lease of a miss (Claim)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from cache.breaker import OPEN
from cache.codec import CacheEntry
from cache.errors import TierError
from cache.keys import CacheKey, KeyBuilder, Selector
from cache.policy import DEFAULT, RequestDirectives
from cache.settings import ExactPolicy
from cache.tenant import credential_headers
from cache.tiers.layered import LayeredTier
from cache.tiers.redis import RedisTier

if TYPE_CHECKING:
    from cache.cache import Cache

log = logging.getLogger("latentgate.cache")
T = TypeVar("T")


class Claim:
    """A Redis lease held (or not) for one key; see RouteCache.claim."""

    __slots__ = ("_key", "_redis", "_token", "peer")

    def __init__(
        self,
        peer: CacheEntry | None = None,
        redis: RedisTier | None = None,
        key: str = "",
        token: str | None = None,
    ) -> None:
        self.peer = peer
        self._redis = redis
        self._key = key
        self._token = token

    async def release(self) -> None:
        redis, token = self._redis, self._token
        self._redis = self._token = None
        if redis is not None and token:
            await redis.release_lease(self._key, token)


class RouteCache:
    """One route's exact cache: its key layout, tier stack and policy, all resolved once."""

    def __init__(
        self,
        cache: Cache,
        route: str,
        policy: ExactPolicy,
        tiers: LayeredTier,
        upstream: str = "",
        keyed: Iterable[str] = (),
    ) -> None:
        """upstream: what the route's answers come from, part of its keys (keys.key_scope);
        keyed: the request headers the route's adapter puts in its keys (Anthropic's version and
        beta set)."""
        self.cache = cache
        self.route = route
        self.policy = policy
        self.tiers = tiers
        self.keys = KeyBuilder(
            route, policy.key.tenant_headers, cache.tenants, policy.key.ignore_fields, upstream
        )
        self.tenant_headers = tuple(policy.key.tenant_headers)
        # a response may Vary on these and still be stored: the key holds them (RFC 9111 4.1: a
        # stored answer is only ever selected for requests that sent the same values)
        held = (*credential_headers(self.tenant_headers), *keyed)
        self.vary_ok = frozenset(h.lower() for h in held)
        self.max_entry_bytes = policy.max_entry_bytes
        self.policy_version = hashlib.blake2b(
            policy.model_dump_json().encode(), digest_size=4
        ).hexdigest()
        m = cache.metrics
        self._miss = m.lookups.labels(route, "-", "miss")
        self._bypass = m.lookups.labels(route, "-", "bypass")
        self._hit = {t: m.lookups.labels(route, t, "hit") for t in ("memory", "redis")}
        self._counts = cache.counts

    def key(
        self, model: str | None, key_fields: Any, headers: Mapping[str, str] | None
    ) -> CacheKey:
        # stamped with the purge generation: an answer to a call that began before a purge
        # is not stored after it (store)
        return self.keys.build(model, key_fields, headers, self.cache.memory.generation)

    def serves(self, entry: CacheEntry, directives: RequestDirectives) -> bool:
        """A stored entry answers this request: fresh by this route's policy and the request's
        directives. One another policy stored (before a reload or restart, or by a sidecar
        with another config) lives at most this policy's TTL from its creation: a TTL
        shortened in the config shortens what is already stored too (it was served for the
        TTL it was stored with)."""
        expires_at = entry.expires_at
        if entry.policy_version != self.policy_version:
            expires_at = min(expires_at, entry.created_at + self.policy.ttl)
            if expires_at <= time.time():
                return False
        return directives.acceptable(entry.age(), expires_at)

    def not_stored(self, reason: str) -> None:
        """A 2xx answer the upstream's headers kept out of the cache (counted by reason)."""
        self.cache.metrics.stores.labels("all", reason).inc()

    def bypass(self) -> None:
        self._counts["bypasses"] += 1
        self._bypass.inc()

    def lookup_l1(self, key: CacheKey, directives: RequestDirectives) -> CacheEntry | None:
        """The synchronous memory lookup the hit path tries first (no await, no task switch)."""
        entry = self.tiers.get_l1(key.value)
        if entry is None or not self.serves(entry, directives):
            return None
        self._counts["lookups"] += 1
        self._counts["memory"] += 1
        self._hit["memory"].inc()
        return entry

    async def lookup(
        self, key: CacheKey, directives: RequestDirectives
    ) -> tuple[CacheEntry, str] | None:
        self._counts["lookups"] += 1
        try:
            found = await self.tiers.lookup(key.value)
        except Exception:  # the cache boundary: a broken tier is a miss, never a failed request
            log.exception("cache lookup failed on route %s", self.route)
            found = None
        if found is not None and self.serves(found[0], directives):
            self._counts[found[1]] += 1
            self._hit[found[1]].inc()
            return found
        self._counts["misses"] += 1
        self._miss.inc()
        return None

    def entry(
        self,
        status: int,
        headers: Sequence[tuple[str, str]],
        *,
        body: bytes | None = None,
        events: list[bytes] | None = None,
        model: str | None = None,
        kind: str = "",
        ttl: float | None = None,
        age: float = 0.0,
    ) -> CacheEntry:
        """age: what the answer already had when it arrived (the upstream's Age): a hit's Age
        counts it too (RFC 9111 4.2.3), and it still expires `ttl` seconds from now."""
        base = self.policy.ttl if ttl is None or ttl <= 0 else ttl
        return CacheEntry(
            status=status,
            headers=list(headers),
            body=body,
            events=events,
            created_at=time.time() - age,
            ttl=base + age,
            model=model,
            policy_version=self.policy_version,
            kind=kind,
        )

    async def store(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store an answer; False when it was not kept (too large, or a drop of its key ran
        since its call began or while it was written), so nothing should index it."""
        if entry.size() > self.max_entry_bytes:
            self.cache.metrics.stores.labels("all", "too_large").inc()
            return False
        memory = self.cache.memory
        generation = memory.generation
        if key.generation is not None and memory.dropped_since(key.generation, key.value):
            # a purge (or an unsafe request's invalidation) of this key ran since this call
            # began: its answer may be what that removed (the next call stores)
            self.cache.metrics.stores.labels("all", "purged").inc()
            return False
        try:
            await self.tiers.put(key.value, entry)
            if memory.dropped_since(generation, key.value):
                # a purge ran while the entry was written and may have missed it
                await self.tiers.delete(key.value)
                return False
        except Exception:  # the cache boundary: a failed insert is logged, the response still goes
            log.exception("cache store failed on route %s", self.route)
        return True

    async def invalidate(self, key: CacheKey) -> None:
        """Drop a key's entry from this process's memory and from Redis (RFC 9111 4.4: an
        unsafe request changed what it answered), then from the memory tier of every other
        process on that Redis (the purge fan-out, this one key alone). Through the cache
        boundary: a tier or an announcement that fails is logged, never the request's failure."""
        # logged as a drop first: a GET of it still in flight does not store the old answer
        self.cache.memory.dropped(key.value.__eq__)
        started = time.monotonic()
        try:
            await self.tiers.delete(key.value)
        except Exception:  # the cache boundary
            log.exception("cache invalidation failed on route %s", self.route)
        fanout, redis = self.cache.fanout, self.cache.redis
        if fanout is None or redis is None:
            if self.cache.siblings is not None:
                try:
                    await self.cache.siblings(Selector.one(key))
                except Exception:  # the cache boundary
                    log.exception("telling the sibling workers failed on route %s", self.route)
            return
        # Announced after the delete (a peer told first could read the old entry back from
        # Redis into its memory), and awaited, so the others are told before the client hears
        # of its change. The request waits for both within one Redis op's deadline: a stalled
        # Redis costs it no more than that; what is left of the announcement then is sent on in
        # the background (a busy process spends the deadline on its own work while Redis is
        # healthy: dropping it left the others serving what was deleted). None is sent while
        # the tier's breaker has Redis marked down, and none is lost: one skipped or failed
        # is handed to the tier's undelivered deletes, which deletes the key again once Redis
        # answers and has the others told then (RedisTier.redo, Cache._announce_late). (Under
        # a burst, deletes that went through and then found the breaker opened by their
        # neighbours' timeouts were skipped, and the others kept serving them.) Nor while it
        # has Redis's writes marked stalled: the delete was kept, and the XADD would stall too.
        if redis.breaker.state == OPEN or redis.writes.state == OPEN:
            fanout.skipped("Redis marked down")
            redis.redo(key.value)
            return
        left = redis.settings.timeouts.op - (time.monotonic() - started)
        try:
            await fanout.announce(
                Selector.one(key),
                max(left, 0.0),
                on_failure=lambda: redis.redo(key.value),
                pending=redis.pending(key.value),
            )
        except Exception:  # the cache boundary (Redis's own errors are counted there)
            log.exception("announcing an invalidation failed on route %s", self.route)

    async def peek(self, key_value: str, directives: RequestDirectives) -> CacheEntry | None:
        """An entry by its stored key (the semantic stage's payloads), through the same error
        boundary as `lookup` but not counted as a lookup of this request's own key."""
        try:
            found = await self.tiers.lookup(key_value)
        except Exception:  # the cache boundary: a broken tier is a miss
            log.exception("cache peek failed on route %s", self.route)
            return None
        if found is None or not self.serves(found[0], directives):
            return None
        return found[0]

    async def payload(
        self, key_value: str, directives: RequestDirectives
    ) -> tuple[CacheEntry | None, bool]:
        """(entry, gone) for a semantic index entry's payload: gone only when the store says
        the key is absent, never when it could not answer or the entry is too old for this
        request (those are a miss for this request, not a stale index entry to drop)."""
        try:
            found = await self.tiers.lookup(key_value, checked=True)
        except TierError:
            return None, False
        except Exception:  # the cache boundary: a broken tier is a miss
            log.exception("cache payload lookup failed on route %s", self.route)
            return None, False
        if found is None:
            return None, True
        if not self.serves(found[0], directives):
            return None, False
        return found[0], False

    async def claim(
        self, key: CacheKey, directives: RequestDirectives = DEFAULT, wait_s: float = math.inf
    ) -> Claim:
        """Cross-process single flight through Redis, best effort.

        The claim's `peer` is the entry another process stored while this one waited for its
        lease, when it answers this request (its max-age and min-fresh; for no-cache, an entry
        stored after the wait began, not the one that was there before); otherwise this process
        computes, holding the lease (when Redis could grant one) until `release()`, which the
        caller owes once its answer is stored. A peer is waited for at most `wait_s` (what is
        left of the request's deadline).
        """
        redis = self.cache.redis
        lease = redis.settings.lease if redis is not None else None
        if redis is None or lease is None or not lease.enabled or not self.tiers.has_l2:
            return Claim()
        generation = self.cache.memory.generation
        token = await redis.acquire_lease(key.value, lease.ttl_ms)
        if token is None:
            peer = await self._await_peer(
                redis, key, directives, min(wait_s, lease.ttl_ms / 1000), lease.poll_ms / 1000
            )
            if peer is not None:
                # (read before a purge that has run since: it answers this call only)
                memory = self.cache.memory
                if self.tiers.l1 is not None and not memory.dropped_since(generation, key.value):
                    self.tiers.l1.put_now(key.value, peer)
                return Claim(peer=peer)
            return Claim()
        return Claim(redis=redis, key=key.value, token=token)

    async def _await_peer(
        self,
        redis: RedisTier,
        key: CacheKey,
        directives: RequestDirectives,
        budget_s: float,
        poll_s: float,
    ) -> CacheEntry | None:
        deadline = time.monotonic() + min(budget_s, self.policy.coalesce_wait_s)
        # no-cache refuses what was stored before this request: the entry there when the wait
        # began is marked by its creation time, and only another one is the peer's answer
        before: float | None = None
        first = True

        def takes(entry: CacheEntry | None) -> bool:
            return (
                entry is not None and entry.created_at != before and self.serves(entry, directives)
            )

        while time.monotonic() < deadline:
            entry = await redis.get(key.value)
            if entry is not None and first and not directives.lookup:
                before = entry.created_at
            elif takes(entry):
                return entry
            first = False
            if not await redis.lease_held(key.value):
                entry = await redis.get(key.value)
                return entry if takes(entry) else None
            await asyncio.sleep(poll_s)
        return None
