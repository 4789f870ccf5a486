"""Semantic single flight: misses in flight, per namespace, that a paraphrase may wait for.

A miss that goes upstream announces its question (`begin`: text, vector) in its namespace. A
later lookup that misses the index searches these flights with the same rule a lookup would
serve by (the cosine floor and the verifier; or the route's learned bar) and, on a match, waits
for that answer instead of calling the upstream too. The leader `finish`es its flight with the
answer (or `fail`s it: waiters then go upstream themselves). In-process only: across sidecars
the exact cache's lease already coalesces identical requests, and a paraphrase racing a miss
in another process costs one upstream call, not a wrong answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cache.codec import CacheEntry
from cache.semantic.features import TextInfo, text_info
from cache.semantic.records import Bar
from cache.semantic.rivals import contested
from cache.semantic.verifier import Verifier

MAX_PER_NAMESPACE = 256  # flights searched per lookup, at most (the oldest are skipped)


@dataclass(eq=False)
class Flight:
    namespace: str
    text: str
    vector: np.ndarray
    info: TextInfo
    owner: PendingFlights
    key: str = ""  # the leader's exact key (the flow waits on that exact flight)
    # the leader's Answers once its answer turned out to be a stream (cache.asks.Answers:
    # only requests that follow_stream it may wait on it), and whether that stream will be
    # kept and shared (when not, nobody should wait on it)
    streamed_by: object = None
    shares: bool = True
    # the leader's exact flight outcome (singleflight.Lead.future): a paraphrase waits on it,
    # and it keeps its result after the exact flight closes, while the leader still stores
    lead: asyncio.Future[CacheEntry | None] | None = None
    future: asyncio.Future[CacheEntry | None] = field(init=False)
    # set when the leader's answer turns out to be a stream, or the flight ends: a waiter
    # decides again then whether to keep waiting
    turned: asyncio.Event = field(init=False)

    def __post_init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()
        self.turned = asyncio.Event()

    def streamed(self, leader: object, shares: bool) -> None:
        self.streamed_by, self.shares = leader, shares
        self.turned.set()

    def finish(self, entry: CacheEntry | None, shared: bool = True) -> None:
        """The leader's answer (None: nothing shareable; waiters go upstream themselves).
        shared False: what the leader streams will not be kept (it outgrew the store)."""
        self.owner.end(self)
        self.shares = self.shares and shared
        self.turned.set()
        if not self.future.done():
            self.future.set_result(entry)

    def fail(self) -> None:
        self.finish(None)

    async def wait(self, wait_s: float) -> CacheEntry | None:
        """The leader's answer, or None when it failed or took longer than wait_s seconds."""
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self.future), wait_s)
        return None


@dataclass(frozen=True, slots=True)
class Joined:
    """A flight a lookup may wait for, and how close its question was to the asked one."""

    flight: Flight
    similarity: float
    score: float

    async def wait(self, wait_s: float) -> CacheEntry | None:
        return await self.flight.wait(wait_s)


class PendingFlights:
    """One per SemanticRoute; one event loop owns it. info: the stage's text_info (with the
    embedder's [UNK] spans, so that a flight is joined by the rule a lookup serves by)."""

    def __init__(self, info: Callable[[str], TextInfo] = text_info) -> None:
        self._by_ns: dict[str, list[Flight]] = {}
        self._info = info

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_ns.values())

    def begin(self, namespace: str, text: str, vector: np.ndarray, key: str = "") -> Flight:
        vec = np.asarray(vector, np.float32)
        flight = Flight(namespace, text, vec, self._info(text), self, key)
        self._by_ns.setdefault(namespace, []).append(flight)
        return flight

    def end(self, flight: Flight) -> None:
        flights = self._by_ns.get(flight.namespace)
        if flights is not None and flight in flights:
            flights.remove(flight)
            if not flights:
                del self._by_ns[flight.namespace]

    async def find(
        self,
        namespace: str,
        text: str,
        vector: np.ndarray,
        verifier: Verifier,
        bar: Bar | None = None,
        rival: float | None = None,
        stored_rivals: int = 0,
    ) -> Joined | None:
        """The in-flight question a lookup would serve for this one, or None. Not when it is
        contested (cache.semantic.rivals): another flight, or `stored_rivals` stored questions,
        at or over the rival cosine."""
        flights = self._by_ns.get(namespace)
        if not flights:
            return None
        flights = flights[-MAX_PER_NAMESPACE:]
        vecs = np.stack([f.vector for f in flights])
        cos = vecs @ np.asarray(vector, np.float32)
        if float(cos.max()) < verifier.floor:
            return None
        order = np.argsort(-cos, kind="stable")[:8]  # like the index's top k
        cands = [flights[i] for i in order.tolist()]
        ccos = cos[order]
        args = (self._info(text), vector, [f.info for f in cands], vecs[order], ccos)
        if bar is None:
            if verifier.offload:
                d = await asyncio.to_thread(verifier.choose, *args)
            else:
                d = verifier.choose(*args)
            if d.index < 0 or contested(ccos, d.index, rival, stored_rivals):
                return None
            chosen, sim, score = cands[d.index], float(ccos[d.index]), d.score
        else:
            if verifier.offload:
                s = await asyncio.to_thread(verifier.scores, *args)
            else:
                s = verifier.scores(*args)
            ok = [
                i
                for i in range(len(cands))
                if s[i] >= 0
                and bar.serves(float(ccos[i]), float(s[i]))
                and not contested(ccos, i, rival, stored_rivals)
            ]
            if not ok:
                return None
            i = max(ok, key=lambda k: float(s[k]))
            chosen, sim, score = cands[i], float(ccos[i]), float(s[i])
        if chosen.future.done():
            return None
        return Joined(chosen, sim, score)
