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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from backends import UpstreamError, UpstreamResponse
from cache.alias import AliasKey, AliasMap
from cache.cache import Claim, RouteCache
from cache.codec import CacheEntry
from cache.keys import CacheKey
from cache.policy import RequestDirectives, response_shareable, storable_ttl
from cache.semantic.off import NoSemantic
from cache.semantic.route import CallLike, SemanticRoute
from cache.semantic.stage import SemanticHit
from cache.singleflight import Lead, LeaderGone, SingleFlight

log = logging.getLogger("latentgate.cache.flow")

Compute = Callable[[], Awaitable[UpstreamResponse]]
_HANDOVERS = 3
# Semantic skip reasons a client is told (X-Cache-Semantic-Skip); the others are the route's
# policy doing what it says (no semantic stage, a sampled call, a short text).
_TOLD = frozenset({"too_long"})
# Response headers an entry never keeps: per-response facts, and what the gateway sets itself.
NOT_KEPT = frozenset(
    {
        "date",
        "server",
        "set-cookie",
        "age",
        "x-cache",
        "server-timing",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)


class Clock(Protocol):
    """Where the flow records its stages (the gateway's Server-Timing)."""

    def add(self, name: str, since: float) -> float: ...


class Answers(Protocol):
    """The protocol's rules for answers, as the flow needs them (supplied per request)."""

    def serves(self, entry: CacheEntry) -> bool:
        """May this request be answered from `entry` (e.g. its framing can be rendered)?"""
        ...

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        """A finished recording as an entry's body (bytes) or events (list); None when the
        stream did not complete, so it is never stored or shared."""
        ...


class AnswerIncomplete(UpstreamError):
    """The leader's stream ended or broke before it completed; waiters get this."""


@dataclass(slots=True)
class Ask:
    key: CacheKey
    directives: RequestDirectives
    call: CallLike
    kind: str
    answers: Answers
    clock: Clock
    compute_stage: str = "upstream"  # the Server-Timing name of the backend's time
    skipped: str = ""  # set by the flow: why the semantic stage passed this call by


@dataclass(slots=True)
class Hit:
    """Served from the cache (or from the leader of the flight this request waited on)."""

    entry: CacheEntry
    x_cache: str  # hit | semantic-hit | miss (a waiter's share of the leader's answer)
    semantic: SemanticHit | None = None


@dataclass(slots=True)
class Fresh:
    """The backend's own answer, going out now. A stream comes with its `recording`, which
    the writer iterates instead of the raw stream and must close."""

    response: UpstreamResponse
    x_cache: str
    recording: Recording | None = None
    reason: str = ""  # why a bypass did not use the cache (sampled, no-store, no-cache)
    semantic_skip: str = ""  # why the semantic stage did not look this call up (too_long)


Result = Hit | Fresh


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

    @property
    def route(self) -> str:
        return self.rc.route

    def key(self, model: str | None, key_fields: Any, headers: Mapping[str, str]) -> CacheKey:
        return self.rc.key(model, key_fields, headers)

    def fast_hit(self, alias: AliasKey) -> tuple[CacheEntry, object] | None:
        """The L1 entry (and remembered framing) for request bytes seen before, or None."""
        known = self.aliases.get(alias)
        if known is None:
            return None
        key, framing = known
        entry = self.rc.lookup_l1(key, _DEFAULT)
        return None if entry is None else (entry, framing)

    async def run(self, ask: Ask, compute: Compute) -> Result:
        d = ask.directives
        if self.rc.policy.only_deterministic and not ask.call.deterministic:
            # A sampled call's answer is one draw: replaying it would change what the client
            # gets. Not looked up, not stored, not coalesced (each caller gets its own draw).
            self.rc.bypass()
            return Fresh(await self._compute(ask, compute), "bypass", reason="sampled")
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
            hit, vector = await self._semantic(ask, t)
            if hit is not None:
                return hit
        if not d.store:
            return Fresh(await self._compute(ask, compute), "bypass", reason="no-store")
        return await self._coalesced(ask, compute, "miss" if d.lookup else "bypass", vector)

    async def _semantic(self, ask: Ask, t: float) -> tuple[Hit | None, np.ndarray | None]:
        """After an exact miss: a verified near-duplicate's stored answer, and the call's vector
        (embedded once: a miss stores it)."""
        sr = self.semantic
        skip = sr.skip_reason(ask.call)
        if skip is not None:
            if skip in _TOLD:
                ask.skipped = skip
            return None, None
        found: dict[str, CacheEntry] = {}

        async def payload(exact_key: str) -> bool:
            entry = await self.rc.peek(exact_key, ask.directives)
            if entry is None or not ask.answers.serves(entry):
                return False
            found[exact_key] = entry
            return True

        vector = hit = None
        try:
            vector = await sr.embed(ask.call)
            hit = await sr.lookup(ask.call, ask.key.tenant_h, payload, vector)
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
                    return await self._lead(ask, compute, x_cache, vector, lead)
                try:
                    shared = await self.flights.wait(ask.key.value, self.rc.policy.coalesce_wait_s)
                except LeaderGone:
                    continue
                except TimeoutError:
                    break
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
            claim = await self.rc.claim(ask.key)
            if claim.peer is not None and ask.answers.serves(claim.peer):
                _settle(lead, claim.peer)
                return Hit(claim.peer, x_cache)
            up = await self._compute(ask, compute)
        except asyncio.CancelledError:
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
        ttl, why = storable_ttl(up.status, up.headers, self.rc.policy.ttl, self.rc.vary_ok)
        if why and 200 <= up.status < 300:
            self.rc.not_stored(why)
        storable = ask.directives.store and ttl > 0
        shareable = response_shareable(up.status, up.headers)
        kept = kept_headers(up.headers)
        reason = "" if ask.directives.lookup else "no-cache"
        if up.body is not None or up.stream is None:
            entry = self.rc.entry(
                up.status, kept, body=up.body or b"", model=ask.call.model, kind=ask.kind, ttl=ttl
            )
            _settle(lead, entry if shareable else None)
            if storable:
                await self._store(ask, entry, vector)
            await claim.release()
            return Fresh(up, x_cache, reason=reason, semantic_skip=ask.skipped)
        recording = Recording(
            self, ask, up, kept, ttl if storable else 0.0, shareable, vector, lead, claim
        )
        return Fresh(up, x_cache, recording, reason, ask.skipped)

    async def _compute(self, ask: Ask, compute: Compute) -> UpstreamResponse:
        t = time.perf_counter()
        up = await compute()
        ask.clock.add(ask.compute_stage, t)
        return up

    async def _store(self, ask: Ask, entry: CacheEntry, vector: np.ndarray | None) -> None:
        await self.rc.store(ask.key, entry)
        try:
            await self.semantic.remember(
                ask.call, ask.key.tenant_h, ask.key.value, entry.ttl, vector
            )
        except Exception:  # the cache boundary: the response still goes out
            log.exception("semantic store failed on route %s", self.route)


class Recording:
    """A streamed answer going out to the leader's client while the flow keeps a copy.

    The writer iterates `chunks()` and always awaits `close()`: a complete recording is
    stored, indexed and handed to the flight's waiters; an incomplete one fails them.
    """

    def __init__(
        self,
        flow: CacheFlow,
        ask: Ask,
        up: UpstreamResponse,
        kept: list[tuple[str, str]],
        ttl: float,
        shareable: bool,
        vector: np.ndarray | None,
        lead: Lead[CacheEntry | None] | None,
        claim: Claim,
    ) -> None:
        self._flow = flow
        self._ask = ask
        self._up = up
        self._kept = kept
        self._ttl = ttl
        self._storable = ttl > 0
        self._shareable = shareable
        self._vector = vector
        self._lead = lead
        self._claim = claim
        self._copy: bytearray | None = bytearray() if self._storable or shareable else None
        self._ended = False  # the upstream stream reached its end (not cut, not abandoned)

    @property
    def wanted(self) -> bool:
        """Does anyone but the leader's client still want the rest (waiters, the store)?"""
        return self._copy is not None

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self._up.stream is not None
        limit = self._flow.rc.max_entry_bytes
        async for chunk in self._up.stream:
            copy = self._copy
            if copy is not None:
                copy += chunk
                if len(copy) > limit:
                    self._copy, self._storable, self._shareable = None, False, False
            yield chunk
        self._ended = True

    async def close(self) -> None:
        try:
            if self._up.stream is not None:
                await self._up.stream.aclose()  # type: ignore[attr-defined]
            entry = self._seal() if self._ended else None
            if entry is None:
                if self._lead is not None:
                    if self._copy is None:
                        # nothing shareable was kept (private or too large), however far the
                        # stream got: waiters fetch their own answers rather than fail
                        self._lead.done(None)
                    else:
                        self._lead.fail(
                            AnswerIncomplete("upstream stream ended before it completed")
                        )
                return
            if self._lead is not None:
                self._lead.done(entry if self._shareable else None)
            if self._storable:
                await self._flow._store(self._ask, entry, self._vector)
        finally:
            if self._lead is not None and self._lead.open:
                self._lead.abandon()
            await self._claim.release()

    def _seal(self) -> CacheEntry | None:
        if self._copy is None:
            return None
        up, ask = self._up, self._ask
        sealed = ask.answers.seal(up.header("Content-Type") or "", bytes(self._copy))
        if sealed is None:
            return None
        rc = self._flow.rc
        ttl = self._ttl or rc.policy.ttl  # (an entry not stored still goes to waiters)
        if isinstance(sealed, list):
            return rc.entry(
                up.status, self._kept, events=sealed, model=ask.call.model, kind=ask.kind, ttl=ttl
            )
        return rc.entry(
            up.status, self._kept, body=sealed, model=ask.call.model, kind=ask.kind, ttl=ttl
        )


def kept_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The response headers an entry keeps (the hop-by-hop ones never arrive here)."""
    return [(k, v) for k, v in headers if k.lower() not in NOT_KEPT]


def _settle(lead: Lead[CacheEntry | None] | None, entry: CacheEntry | None) -> None:
    if lead is not None:
        lead.done(entry)


_DEFAULT = RequestDirectives()


class Flows:
    """Every cached route's flow, by route name; swapped whole on reload."""

    def __init__(self, flows: Mapping[str, CacheFlow] | None = None) -> None:
        self._flows: dict[str, CacheFlow] = dict(flows or {})

    def get(self, route: str) -> CacheFlow | None:
        return self._flows.get(route)

    def replace(self, flows: Mapping[str, CacheFlow]) -> None:
        """A reload's new policies; aliases go with the old flows (a changed key policy could
        make a remembered request → key mapping point at an entry the new one would not match)."""
        self._flows = dict(flows)
