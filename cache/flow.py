"""One cached call, start to finish: exact → semantic → coalesce → compute → store → index.

The gateway hands in what it parsed (an `Ask`) and one backend callable; it gets back what to
send (a `Hit` or a `Fresh` answer) and only renders and streams it. Nothing here knows HTTP:
what is protocol-specific about an answer (may this client be served from that entry? is this
recorded stream complete?) comes in with the Ask as its `answers`.

Single flight covers every cached route, semantic ones included. A request can check the exact
tier just before the leader stores, then spend milliseconds embedding and reach the coalescer
after the flight has closed; so whoever wins a flight re-checks the tiers before computing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from backends import UpstreamResponse
from cache.alias import AliasKey, AliasMap
from cache.asks import Answers, Ask, Clock, Fresh, Hit, Result
from cache.codec import CacheEntry
from cache.hit_headers import kept_headers
from cache.keys import CacheKey
from cache.live_streams import LiveStreams
from cache.policy import NotCached, RequestDirectives, initial_age, response_shareable, storable_ttl
from cache.recording import Recording
from cache.route_cache import Claim, RouteCache
from cache.semantic import flow_hooks  # issue 14: error budget, semantic single flight
from cache.semantic.off import NoSemantic
from cache.semantic.route import CallLike, SemanticRoute
from cache.singleflight import CallerGone, Lead, LeaderGone, SingleFlight
from cache.tenant import credential_headers, tenant_of

log = logging.getLogger("latentgate.cache.flow")

Compute = Callable[[], Awaitable[UpstreamResponse]]
_HANDOVERS = 3
_LEASE_SHARE = 0.5  # of a request's budget, at most, spent waiting for another gateway
# Semantic skip reasons a client is told (X-Cache-Semantic-Skip); the others are the route's
# policy doing what it says (no semantic stage, a sampled call, a short text).
_TOLD = frozenset({"too_long", "not_unicode"})


class CacheFlow:
    """One route's cached calls. Built once per route (and again on reload)."""

    def __init__(
        self,
        rc: RouteCache,
        semantic: SemanticRoute | NoSemantic,
        flights: SingleFlight[CacheEntry | None],
    ) -> None:
        self.rc = rc
        self.semantic = semantic
        self.flights = flights
        self.aliases = AliasMap()
        self._identity_names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.live = LiveStreams()  # streams identical streaming requests may follow

    @property
    def route(self) -> str:
        return self.rc.route

    def key(self, model: str | None, key_fields: Any, headers: Mapping[str, str]) -> CacheKey:
        return self.rc.key(model, key_fields, headers)

    def tenant(self, headers: Mapping[str, str], extra: tuple[str, ...] = ()) -> str:
        """The request's tenant identity over this route's credential headers and `extra`
        (the header names resolved once per route, not per request)."""
        names = self._identity_names.get(extra)
        if names is None:
            names = credential_headers((*self.rc.tenant_headers, *extra))
            self._identity_names[extra] = names
        return tenant_of(headers, names, resolved=True)

    def fast_hit(self, alias: AliasKey) -> tuple[CacheEntry, Answers] | None:
        """The L1 entry (and remembered framing) for request bytes seen before, or None: also
        when the entry cannot serve that framing (the long way then makes it a miss)."""
        known = self.aliases.get(alias)
        if known is None:
            return None
        key, framing, pin = known
        entry = self.rc.lookup_l1(key, _DEFAULT)
        if entry is None or not framing.serves(entry):
            return None
        if pin is not None and entry.created_at != pin:
            return None  # refilled since: it may echo another request's id
        return entry, framing

    async def bypass(
        self,
        call: CallLike,
        directives: RequestDirectives,
        clock: Clock,
        compute_stage: str,
        compute: Compute,
    ) -> Fresh | None:
        """A call the cache must not touch goes straight to the backend; None for any other.
        Neither case needs the key, so the gateway can ask before building one."""
        if directives.only_if_cached and not (
            directives.lookup and (call.deterministic or not self.rc.policy.only_deterministic)
        ):
            raise NotCached("only-if-cached: this request is never answered from the cache")
        if self.rc.policy.only_deterministic and not call.deterministic:
            # A sampled call's answer is one draw: replaying it would change what the client
            # gets. Not looked up, not stored, not coalesced (each caller gets its own draw).
            self.rc.bypass()
            t = time.perf_counter()
            up = await compute()
            clock.add(compute_stage, t)
            # a protocol may say why else a call is not determined by its request (a v2
            # sequence: "stateful")
            extra = getattr(call, "extra", None)
            reason = extra.get("bypass_reason", "sampled") if isinstance(extra, dict) else "sampled"
            return Fresh(up, "bypass", reason=reason)
        if directives.lookup or directives.store:
            return None
        t = time.perf_counter()
        self.rc.bypass()
        t = clock.add("cache", t)
        up = await compute()
        clock.add(compute_stage, t)
        return Fresh(up, "bypass", reason=directives.reason or "no-store")

    async def run(self, ask: Ask, compute: Compute) -> Result:
        d = ask.directives
        passed = await self.bypass(ask.call, d, ask.clock, ask.compute_stage, compute)
        if passed is not None:
            return passed
        t = time.perf_counter()
        if d.lookup:
            entry = self.rc.lookup_l1(ask.key, d)
            if entry is None:
                found = await self.rc.lookup(ask.key, d)
                entry = found[0] if found is not None else None
            if entry is not None and ask.answers.serves(entry):
                ask.clock.add("cache", t)
                return Hit(entry, "hit")
        else:
            self.rc.bypass()
        t = ask.clock.add("cache", t)
        vector = None
        if d.lookup:
            hit, vector = await self._semantic(ask, t, compute)
            if hit is None:  # issue 14: a paraphrase of a miss in flight waits for that answer
                wait_s = self.rc.policy.coalesce_wait_s
                hit = await flow_hooks.flight_hit(
                    self.semantic,
                    self.flights,
                    ask,
                    vector,
                    compute,
                    wait_s,
                    self.rc.max_entry_bytes,
                )
            if hit is not None:
                return hit
            if d.only_if_cached:
                raise NotCached("only-if-cached: no stored answer for this request")
        if not d.store:
            return Fresh(await self._compute(ask, compute), "bypass", reason="no-store")
        return await self._coalesced(ask, compute, "miss" if d.lookup else "bypass", vector)

    async def _semantic(
        self, ask: Ask, t: float, compute: Compute
    ) -> tuple[Hit | None, np.ndarray | None]:
        """After an exact miss: a verified near-duplicate's stored answer, and the call's vector
        (embedded once: a miss stores it)."""
        sr = self.semantic
        skip = sr.skip_reason(ask.call)
        if skip is not None:
            if skip in _TOLD:
                ask.skipped = skip
            return None, None
        found: dict[str, CacheEntry] = {}

        async def payload(exact_key: str) -> bool | None:
            """True: served; False: gone from the store (the index entry is stale); None: not
            for this request (too old for its max-age, a framing it cannot take, a store that
            did not answer), which must not cost other clients the entry."""
            entry, gone = await self.rc.payload(exact_key, ask.directives)
            if entry is None:
                return False if gone else None
            if not ask.answers.serves(entry):
                return None
            found[exact_key] = entry
            return True

        vector = hit = None
        try:
            vector = await sr.embed(ask.call)
            # issue 14: search = lookup + the unserved candidate (labelled after the miss)
            assert isinstance(sr, SemanticRoute)
            # a miss is counted by flow_hooks.flight_hit: a paraphrase in flight may serve it
            tenant, own = ask.key.tenant_scope, ask.key.value
            res = await sr.search(ask.call, tenant, payload, vector, own, defer_miss=True)
            hit, ask.semantic_candidate = res.hit, res.candidate
            ask.semantic_rivals, ask.semantic_missed = res.rivals, res.missed
            # an only-if-cached client asked that nothing go upstream for it: no audit either
            if hit is not None:
                max_bytes = self.rc.max_entry_bytes  # (the audit's fresh answer's cap)
                flow_hooks.count_hit(sr, ask, hit, found[hit.exact_key], compute, max_bytes)
        except Exception:  # the cache boundary: a semantic failure is a miss, never an error
            log.exception("semantic lookup failed on route %s", self.route)
        ask.clock.add("semantic", t)
        if hit is None:
            return None, vector
        return Hit(found[hit.exact_key], "semantic-hit", hit), vector

    async def _coalesced(
        self, ask: Ask, compute: Compute, x_cache: str, vector: np.ndarray | None
    ) -> Result:
        if self.rc.policy.coalesce:
            for _ in range(_HANDOVERS):
                lead = self.flights.try_lead(ask.key.value)
                if lead is not None:
                    # issue 14: paraphrases may wait on this flight while it computes
                    with flow_hooks.announced(self.semantic, ask.call, ask.key, vector, lead) as a:
                        recording = None
                        try:
                            led = await self._lead(ask, compute, x_cache, vector, lead)
                            recording = led.recording if isinstance(led, Fresh) else None
                        finally:
                            self.live.started(ask.key.value, recording if lead.open else None)
                        return a.lasting(led, ask.answers)
                flight = self.flights.future(ask.key.value)
                if flight is None:
                    continue  # it closed as this request looked: lead one
                try:
                    with ask.waiting():
                        shared = await self.live.wait(
                            ask.key.value,
                            self.flights.wait_on(
                                flight,
                                ask.wait_s(self.rc.policy.coalesce_wait_s),
                                lambda e: e is not None and ask.answers.serves(e),
                            ),
                            ask.answers,
                        )
                except LeaderGone:
                    continue
                except TimeoutError:
                    break
                if isinstance(shared, UpstreamResponse):
                    self.flights.count("followed")
                    return Fresh(shared, x_cache)  # the leader's stream, as it comes
                if shared is None or not ask.answers.serves(shared):
                    break  # the leader's answer was private, or cannot be shown to this client
                return Hit(shared, x_cache)
        return await self._lead(ask, compute, x_cache, vector, None)

    async def _lead(
        self,
        ask: Ask,
        compute: Compute,
        x_cache: str,
        vector: np.ndarray | None,
        lead: Lead[CacheEntry | None] | None,
    ) -> Result:
        claim: Claim | None = None
        try:
            if ask.directives.lookup:
                # a flight that closed while this request was on its way here left its entry
                entry = self.rc.lookup_l1(ask.key, ask.directives)
                if entry is not None and ask.answers.serves(entry):
                    _settle(lead, entry)
                    return Hit(entry, "hit")
            # Another gateway's lease: its holder may have died with it, so at most half the
            # budget goes to waiting, and the other half is left for this request's own call.
            with ask.waiting():
                claim = await self.rc.claim(
                    ask.key, ask.directives, ask.wait_s(float("inf"), _LEASE_SHARE)
                )
            if claim.peer is not None and ask.answers.serves(claim.peer):
                _settle(lead, claim.peer)
                return Hit(claim.peer, x_cache)
            up = await self._compute(ask, compute)
        except (asyncio.CancelledError, CallerGone):
            if lead is not None:
                lead.abandon()
            if claim is not None:
                await claim.release()
            raise
        except BaseException as exc:
            if lead is not None:
                lead.fail(exc)
            if claim is not None:
                await claim.release()
            raise
        try:
            return await self._answer(ask, up, x_cache, vector, lead, claim)
        except BaseException as exc:
            # a fault between the answer and its recording (building, sealing or storing the
            # entry) left the flight open for good: every later identical request waited out
            # coalesce_wait_s on it, then fetched its own (review of this session's change)
            if lead is not None:  # (nothing once settled)
                if isinstance(exc, asyncio.CancelledError | CallerGone):
                    lead.abandon()  # as before the answer: the waiters take over
                else:
                    lead.fail(exc)
            await claim.release()
            close = getattr(up.stream, "aclose", None)  # (a recording would own it: not begun)
            if close is not None:
                await close()
            raise

    async def _answer(
        self,
        ask: Ask,
        up: UpstreamResponse,
        x_cache: str,
        vector: np.ndarray | None,
        lead: Lead[CacheEntry | None] | None,
        claim: Claim,
    ) -> Result:
        """The computed answer to the client, and to the cache and the flight's waiters where
        they may have it: stored whole, or recorded as it streams (Recording)."""
        age = initial_age(up.headers, ask.response_delay)
        ttl, why = storable_ttl(up.status, up.headers, self.rc.policy.ttl, self.rc.vary_ok, age=age)
        shareable = response_shareable(up.status, up.headers, self.rc.vary_ok, age=age)
        if 200 <= up.status < 300 and not ask.answers.keeps(up.header("Content-Type") or ""):
            # not the kind of answer the route serves (a captive portal's login page, a
            # misrouted replica's file): this client gets it, as from the upstream itself; it
            # was stored and replayed to every later client until the TTL
            ttl, why, shareable = 0.0, why or "content-type", False
        if why and 200 <= up.status < 300:
            self.rc.not_stored(why)
        storable = ask.directives.store and ttl > 0
        kept = kept_headers(up.headers, up.status)
        reason = "" if ask.directives.lookup else "no-cache"
        if up.body is not None or up.stream is None:
            body = up.body or b""
            if storable and ask.answers.seal(up.header("Content-Type") or "", body) is None:
                # kept by the rule a recorded stream is (a JSON API's 200 must parse): a
                # replica that framed a broken body well was replayed to every later client
                # until the TTL; its waiters fetch their own answers, as a stream's would
                self.rc.not_stored("incomplete")
                storable = shareable = False
            entry = self.rc.entry(
                up.status,
                kept,
                body=body,
                model=ask.call.model,
                kind=ask.kind,
                ttl=ttl,
                age=age,
            )
            # (an answer over max_entry_bytes is not kept either: RouteCache.store drops it)
            entry.reusable = storable and entry.size() <= self.rc.max_entry_bytes
            _settle(lead, entry if shareable else None)
            if storable:
                await self._store(ask, entry, vector)
            await claim.release()
            return Fresh(up, x_cache, reason=reason, semantic_skip=ask.skipped)
        recording = Recording(
            self, ask, up, kept, ttl if storable else 0.0, shareable, vector, lead, claim
        )
        recording.start()  # the upstream is read at its pace, not the leader's client's
        return Fresh(up, x_cache, recording, reason, ask.skipped)

    async def _compute(self, ask: Ask, compute: Compute) -> UpstreamResponse:
        t = time.perf_counter()
        up = await compute()
        ask.response_delay = time.perf_counter() - t
        ask.clock.add(ask.compute_stage, t)
        return up

    async def _store(self, ask: Ask, entry: CacheEntry, vector: np.ndarray | None) -> None:
        stored = await self.rc.store(ask.key, entry)
        try:
            # what the entry has left (its ttl also counts the Age it arrived with); an answer
            # not kept (too large, purged in flight) is not indexed, but still labels
            left = entry.expires_at - time.time()
            if stored:
                await self.semantic.remember(
                    ask.call, ask.key.tenant_scope, ask.key.value, left, vector
                )
            cand, sr = ask.semantic_candidate, self.semantic  # issue 14: label the candidate
            if cand is not None and isinstance(sr, SemanticRoute):
                load = flow_hooks.stored_loader(self.rc, cand.exact_key)
                sr.label_after_miss(ask.call, ask.key.tenant_scope, cand, load, entry)
        except Exception:  # the cache boundary: the response still goes out
            log.exception("semantic store failed on route %s", self.route)


def _settle(lead: Lead[CacheEntry | None] | None, entry: CacheEntry | None) -> None:
    if lead is not None:
        lead.done(entry)


_DEFAULT = RequestDirectives()
