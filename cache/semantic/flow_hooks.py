"""What cache/flow.py calls for the semantic error budget and semantic single flight.

Kept out of the flow so its edits stay a few marked lines: counting a served semantic hit and
building a fresh answer for its audit (a second backend call, read whole up to the route's
max_entry_bytes and sealed by the request's protocol, never stored or shown to a client),
loading a candidate's stored answer for a label, and waiting for an equivalent miss in flight
(counted and audited as a semantic hit when it serves the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from backends import BodyTooLarge, UpstreamResponse
from cache.asks import Ask, Hit
from cache.codec import CacheEntry
from cache.keys import CacheKey
from cache.policy import DEFAULT, RequestDirectives
from cache.semantic.learn import AuditSkipped
from cache.semantic.pending import Flight
from cache.semantic.records import SemanticHit
from cache.semantic.route import CallLike, SemanticRoute
from cache.singleflight import Lead, LeaderGone, SingleFlight

log = logging.getLogger("latentgate.semantic.flow")

_ANY_AGE = RequestDirectives()
R = TypeVar("R")
Compute = Callable[[], Awaitable[UpstreamResponse]]


class Sealer(Protocol):
    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None: ...


class Peek(Protocol):
    async def peek(self, key_value: str, directives: RequestDirectives) -> CacheEntry | None: ...


def audit_fetch(
    compute: Compute, answers: Sealer, kind: str, max_bytes: int
) -> Callable[[], Awaitable[CacheEntry | None]]:
    """The audit's fresh answer, read whole but held to the route's max_entry_bytes: a bigger
    answer is never stored nor compared on a miss either, so past that the read stops (the
    connection closed, an endless body never buffered) and the audit is skipped, no label."""

    async def fetch() -> CacheEntry | None:
        up = await compute()
        try:
            raw = await up.read_capped(max_bytes)
        except BodyTooLarge:
            raise AuditSkipped(
                "too_large", f"the upstream's answer is over max_entry_bytes ({max_bytes})"
            ) from None
        sealed = answers.seal(up.header("Content-Type") or "", raw)
        if sealed is None:
            return None
        if isinstance(sealed, list):
            return CacheEntry(up.status, [], events=sealed, kind=kind)
        return CacheEntry(up.status, [], body=sealed, kind=kind)

    return fetch


def count_hit(
    sr: SemanticRoute,
    ask: Ask,
    hit: SemanticHit,
    served: CacheEntry,
    compute: Compute,
    max_bytes: int,
) -> None:
    """A semantic hit going out (found in the index, or a paraphrase's flight's answer): the
    budget counts it (`should_audit`), and for its share the client's own question goes
    upstream in the background, its answer compared with `served`, the one the client got.
    An only-if-cached client asked that nothing go upstream for it: counted, never audited."""
    if sr.should_audit(ask.call, hit, may_audit=not ask.directives.only_if_cached):
        sr.audit(
            ask.call,
            ask.key.tenant_scope,
            hit,
            served,
            audit_fetch(compute, ask.answers, ask.kind, max_bytes),
        )


async def flight_hit(
    sr: object,
    flights: SingleFlight[CacheEntry | None],
    ask: Ask,
    vector: np.ndarray | None,
    compute: Compute,
    wait_s: float,
    max_bytes: int,
) -> Hit | None:
    """After the index missed: the answer of an equivalent miss in flight, as a semantic hit
    (`join_flight`), or None (go on as a miss). The lookup left its count here
    (`Search.missed`), and it is counted once: a hit when a flight's answer is served (in
    `lookups{result}`, and by the budget, which may audit it: the leader's answer, which this
    client got, against this client's own question's), else a miss. None for an only-if-cached
    or no-store request, or when the lookup failed (no rivals: a flight cannot be weighed)."""
    if not ask.semantic_missed or not isinstance(sr, SemanticRoute):
        return None
    ask.semantic_missed = False  # counted below, whatever happens
    d, rivals, served = ask.directives, ask.semantic_rivals, None
    try:
        if vector is None or not d.store or d.only_if_cached or rivals is None:
            return None
        tenant, own = ask.key.tenant_scope, ask.key.value
        with ask.waiting():
            joined = await join_flight(
                sr,
                flights,
                ask.call,
                tenant,
                vector,
                ask.wait_s(wait_s),
                own,
                rivals,
                ask.answers,
                d,
            )
        if joined is None or not ask.answers.serves(joined[0]):
            return None
        served = Hit(joined[0], "semantic-hit", joined[1])
    finally:
        sr.count("miss" if served is None else "hit")
    try:
        count_hit(sr, ask, joined[1], joined[0], compute, max_bytes)
    except Exception:  # the cache boundary: the hit goes out whatever its count did
        log.exception("semantic hit count failed on route %s", sr.route)
    return served


def stored_loader(rc: Peek, exact_key: str) -> Callable[[], Awaitable[CacheEntry | None]]:
    async def load() -> CacheEntry | None:
        return await rc.peek(exact_key, _ANY_AGE)

    return load


class Announcement:
    """A leader's question announced to paraphrases (SemanticRoute.join) while its exact flight
    is open: until the leader returns, or, for a streamed answer, until its recording closes
    (the exact flight settles there, and a paraphrase waiting on it gets the whole stream)."""

    def __init__(self, flight: Flight | None) -> None:
        self.flight = flight
        self.handed_over = False

    def lasting(self, result: R, answers: object) -> R:
        """Hands the announcement to a streamed result's recording when that will share its
        answer (one not kept could only make paraphrases wait for nothing); from then on only
        requests that `follows_stream` the leader's framing (answers) may join."""
        recording = getattr(result, "recording", None)
        if self.flight is not None and recording is not None:
            self.flight.streamed(answers, recording.will_share)
            if recording.will_share:
                recording.on_close = self.end
                self.handed_over = True
        return result

    def end(self, shared: bool = True) -> None:
        if self.flight is not None:
            self.flight.finish(None, shared)


@contextlib.contextmanager
def announced(
    sr: object,
    call: CallLike,
    key: CacheKey,
    vector: np.ndarray | None,
    lead: Lead[CacheEntry | None],
) -> Iterator[Announcement]:
    flight = None
    if vector is not None and isinstance(sr, SemanticRoute):
        try:
            flight = sr.begin(call, key.tenant_scope, vector, key.value)
        except Exception:  # the cache boundary: no announcement, and the exact lead goes on
            log.exception("semantic flight announcement failed")
            flight = None
        if flight is not None:
            flight.lead = lead.future
    announcement = Announcement(flight)
    try:
        yield announcement
    finally:
        if not announcement.handed_over:
            announcement.end()


def _usable(entry: CacheEntry | None) -> bool:
    return entry is not None and 200 <= entry.status < 300 and entry.reusable


def _may_wait(flight: Flight, answers: Any) -> bool:
    if not flight.shares:
        return False
    leader = flight.streamed_by
    return leader is None or (answers is not None and bool(answers.follows_stream(leader)))


async def join_flight(
    sr: SemanticRoute,
    flights: SingleFlight[CacheEntry | None],
    call: CallLike,
    tenant: str,
    vector: np.ndarray,
    wait_s: float,
    own_key: str = "",
    stored_rivals: int = 0,
    answers: Any = None,
    directives: RequestDirectives = DEFAULT,
) -> tuple[CacheEntry, SemanticHit] | None:
    """An in-flight miss this lookup would serve: wait on its exact flight for the answer.
    None (compute as usual) when there is none, it failed, answered an error, was private or
    took too long, or turned out to stream an answer this request would not wait out (one it
    cannot be rendered from, one that streams to it too, or one that will not be kept), or its
    answer is older than this request's max-age or expires within its min-fresh (a stored
    answer the index found would be refused to it the same way: RouteCache.payload)."""

    def usable(entry: CacheEntry | None) -> bool:
        return (
            entry is not None
            and _usable(entry)
            and directives.acceptable(entry.age(), entry.expires_at)
        )

    try:
        joined = await sr.join(call, tenant, vector, stored_rivals)
        if joined is None or joined.flight.key == own_key:
            return None  # (the same request in flight: the exact coalescer's business)
        flight = joined.flight
        if flight.lead is None or not _may_wait(flight, answers):
            return None
        waiting = asyncio.ensure_future(flights.wait_on(flight.lead, wait_s, usable))
        turned = asyncio.ensure_future(flight.turned.wait())
        ended = asyncio.ensure_future(asyncio.shield(flight.future))
        try:
            await asyncio.wait({waiting, turned}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                # the leader's answer turned out to be a stream (or its flight ended) first:
                # wait on only if this request takes that stream, and only while it will be
                # kept (one that outgrows the store mid-way ends the flight unshared)
                if not _may_wait(flight, answers):
                    return None
                await asyncio.wait({waiting, ended}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done() and not flight.shares:
                    return None
            shared = await waiting
        finally:
            for task in (waiting, turned, ended):
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: a result this request left is not an error
    except (LeaderGone, TimeoutError):
        return None
    except Exception:  # the leader's failure is its own; this request computes
        log.debug("semantic single flight: the leader failed", exc_info=True)
        return None
    if shared is None or not usable(shared):
        # An error is the leader's own (a 429 names its caller's quota, a 400 its request), and
        # so is an answer not kept (no-cache, max-age=0): an identical request may share it, a
        # paraphrase goes upstream itself. Only a stored answer is a semantic hit.
        return None
    bar = sr.bar(tenant)
    if bar is not None and not bar.serves(joined.similarity, joined.score):
        # The bar moved while this request waited (labels or audits raised or closed it): it
        # would not serve this match now, so neither does the flight (nor does it count a hit).
        return None
    return shared, SemanticHit(joined.flight.key, joined.similarity, joined.score)
