"""The semantic stage: embed → search the namespace → verify → the exact key of a stored answer.

Entries hold only a namespace, the text and the exact key of the payload (which lives once, in
the exact store); the vector lives only in the index, compactly, and the text's features are
computed when the entry is a candidate (a small LRU keeps the hot ones). The entries are kept,
bounded and evicted by cache.semantic.entries. An entry goes when its TTL passes, when the exact
entry is purged (`remove_key`), or when a lookup finds its payload gone. Adds and removals are
also published through an optional `Replicator` (cache.semantic.sync) to other gateway processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np

from cache.embedder import Embedder
from cache.semantic.entries import EntryBook
from cache.semantic.features import TextInfo, text_info
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.records import (
    Bar,
    Candidate,
    Entry,
    Replicator,
    Search,
    SemanticHit,
    entry_id,
)
from cache.semantic.rivals import contested, rivals
from cache.semantic.verifier import Decision, Verifier

log = logging.getLogger("latentgate.semantic")

TOP_K = 5
# A wrong-hit report raises that entry's bar to this verifier score (cosine when verifier off).
TIGHTEN_STEP = 0.03
INFO_CACHE = 4096  # TextInfo of recent candidates (a few KB each, so not kept per entry)


class SemanticStage(EntryBook):
    """One per gateway process; routes share it, namespaces keep them apart."""

    enabled = True

    def __init__(
        self,
        embedder: Embedder,
        index: VectorIndex,
        metrics: SemanticMetrics,
        max_entries: int = 100_000,
        max_bytes: int = 256 << 20,
    ) -> None:
        super().__init__(index, metrics, max_entries, max_bytes)
        self.embedder = embedder
        self.replicator: Replicator | None = None
        # False while the embedder loads (cache.semantic.setup): routes skip the stage meanwhile.
        self.ready = True
        metrics.device.labels(embedder.device, index.device).set(1)

    def text_info(self, text: str) -> TextInfo:
        """The verifier's view of a text, with the spans this embedder reads as [UNK] (which
        no verifier may serve across: features.contradicts)."""
        return text_info(text, self.embedder.unseen)

    async def embed(self, text: str) -> np.ndarray:
        t = time.perf_counter()
        vec = await self.embedder.embed(text)
        self.metrics.latency.labels("embed").observe(time.perf_counter() - t)
        return vec

    def _candidates(
        self, namespace: str, vec: np.ndarray
    ) -> tuple[float, list[Entry], list[float]]:
        """The namespace's nearest live entries and their cosines (expired ones are dropped on
        the way); the time the search ended, for the verify stage's latency."""
        t = time.perf_counter()
        found = self.index.search(namespace, vec, TOP_K)
        t2 = time.perf_counter()
        self.metrics.latency.labels("search").observe(t2 - t)
        now = time.time()
        cands: list[Entry] = []
        sims: list[float] = []
        for ident, sim in found:
            e = self.entries.get(ident)
            if e is None or e.expires_at <= now:
                self._drop(ident)
                continue
            cands.append(e)
            sims.append(sim)
        return t2, cands, sims

    async def lookup(
        self,
        namespace: str,
        text: str,
        verifier: Verifier,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
        rival: float | None = None,
    ) -> SemanticHit | None:
        found = await self.find(namespace, text, verifier, payload_exists, vector, rival)
        return found.hit

    async def find(
        self,
        namespace: str,
        text: str,
        verifier: Verifier,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
        rival: float | None = None,
        defer_miss: bool = False,
    ) -> Search:
        """The verifier's pick among the nearest entries, unless another stored question is at
        or over `rival` too (contested: cache.semantic.rivals; None: no such rule). defer_miss:
        a miss is not counted but comes back `missed`, for the caller to `count`."""
        vec = await self.embed(text) if vector is None else vector
        t2, cands, sims = self._candidates(namespace, vec)
        cands, sims, there = await self._without_stale_rivals(cands, sims, rival, payload_exists)
        if not cands:
            return self._missed(Search(None, None), defer_miss)
        cos = np.asarray(sims, dtype=np.float32)
        near = rivals(cos, rival)
        idents = [entry_id(c.exact_key) for c in cands]
        args = (
            self.text_info(text),
            vec,
            [self._info(i, c) for i, c in zip(idents, cands, strict=True)],
            self.index.vectors(idents),
            cos,
            [c.bar for c in cands],
        )
        if not verifier.offload:
            decision = verifier.choose(*args)
        elif float(cos.max()) >= verifier.floor:
            decision = await asyncio.to_thread(verifier.choose, *args)
        else:
            decision = Decision(-1, 0.0, 0)  # nothing reaches the floor: no thread hop
        self.metrics.latency.labels("verify").observe(time.perf_counter() - t2)
        self.metrics.similarity.observe(float(cos[0]))
        if decision.refused:
            self.metrics.refusals.inc(decision.refused)
        if decision.index < 0:
            return self._missed(Search(None, None, near), defer_miss)
        if contested(cos, decision.index, rival):
            self.metrics.lookups.labels("contested").inc()
            return Search(None, None, near)
        chosen = cands[decision.index]
        found = await self._payload(chosen.exact_key, payload_exists, there)
        if found is False:
            # The payload expired or was evicted from the exact store: this vector is stale.
            await self.remove_key(chosen.exact_key)
            self.metrics.lookups.labels("stale").inc()
            return Search(None, None, rivals(np.delete(cos, decision.index), rival))
        if found is None:  # there, but not for this request (its max-age, its framing)
            return self._missed(Search(None, None, near), defer_miss)
        self.metrics.lookups.labels("hit").inc()
        hit = SemanticHit(chosen.exact_key, float(cos[decision.index]), decision.score)
        return Search(hit, None, near)

    async def search(
        self,
        namespace: str,
        text: str,
        verifier: Verifier,
        bar: Bar,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
        observe: Callable[[float, float], None] | None = None,
        rival: float | None = None,
        own_key: str | None = None,
        defer_miss: bool = False,
    ) -> Search:
        """A lookup under a learned bar: every candidate over the cosine floor is scored, the
        most probable one the bar (and its own per-entry bar) serves is the hit; the best one
        overall, when not served, comes back as the candidate to label. `observe` gets the best
        candidate's (cosine, score): where the route's traffic is. Contested candidates
        (cache.semantic.rivals) are neither served nor labelled: the bar is learned for the
        candidates it may serve. `own_key`: the request's exact key. Its own entry is no
        candidate: when it is there but cannot serve this request (a stream asked for as one
        body, an answer older than the client's max-age), the miss stores its fresh answer
        under that key, and a label would compare the answer with itself (always "agree").
        defer_miss: as for `find`."""
        vec = await self.embed(text) if vector is None else vector
        t2, cands, sims = self._candidates(namespace, vec)
        if own_key is not None and any(c.exact_key == own_key for c in cands):
            others = [(c, x) for c, x in zip(cands, sims, strict=True) if c.exact_key != own_key]
            cands, sims = [c for c, _ in others], [x for _, x in others]
        cands, sims, there = await self._without_stale_rivals(cands, sims, rival, payload_exists)
        cos = np.asarray(sims, dtype=np.float32)
        near = rivals(cos, rival)
        if not cands or float(cos.max()) < verifier.floor:
            return self._missed(Search(None, None, near), defer_miss)
        idents = [entry_id(c.exact_key) for c in cands]
        infos = [self._info(i, c) for i, c in zip(idents, cands, strict=True)]
        args = (self.text_info(text), vec, infos, self.index.vectors(idents))
        if verifier.offload:
            score = await asyncio.to_thread(verifier.scores, *args, cos)
        else:
            score = verifier.scores(*args, cos)
        self.metrics.latency.labels("verify").observe(time.perf_counter() - t2)
        self.metrics.similarity.observe(float(cos[0]))

        def servable(i: int) -> bool:
            """The bar, and the entry's own bar, would serve candidate i."""
            p = float(score[i])
            return p >= 0 and bar.serves(float(cos[i]), p) and p >= cands[i].bar

        free = np.array([not contested(cos, i, rival) for i in range(len(cands))])
        if not free[score >= 0].any():
            # "contested" only when the rule kept a hit from being served
            kept = any(servable(i) for i in range(len(cands)))
            return self._missed(Search(None, None, near), defer_miss, kept)
        score = np.where(free, score, -1.0)
        best = int(np.argmax(score))
        if observe is not None:
            observe(float(cos[best]), float(score[best]))
        order = np.argsort(-score, kind="stable")
        for i in order.tolist():
            if not servable(i):
                continue
            c, p = float(cos[i]), float(score[i])
            found = await self._payload(cands[i].exact_key, payload_exists, there)
            if found is False:
                await self.remove_key(cands[i].exact_key)
                self.metrics.lookups.labels("stale").inc()
                continue
            if found is None:  # there, but not for this request: kept for everyone else
                continue
            self.metrics.lookups.labels("hit").inc()
            return Search(SemanticHit(cands[i].exact_key, c, p), None, near)
        b = cands[best]
        if entry_id(b.exact_key) not in self.entries:
            # its payload was gone (removed above)
            return self._missed(Search(None, None, near), defer_miss)
        served = bar.serves(float(cos[best]), float(score[best]))
        cand = Candidate(b.exact_key, float(cos[best]), float(score[best]), served)
        return self._missed(Search(None, cand, near), defer_miss)

    def count(self, result: str) -> None:
        """One lookup's result on /metrics (the flow counts a miss a lookup left to it)."""
        self.metrics.lookups.labels(result).inc()

    def _missed(self, found: Search, defer: bool, contested: bool = False) -> Search:
        """A lookup that serves nothing: counted as a miss (or contested), or, a miss with
        `defer`, left to the caller: a paraphrase in flight may still serve that lookup, and it
        is then a hit (cache.semantic.flow_hooks.flight_hit), counted once either way."""
        if defer and not contested:
            return dataclasses.replace(found, missed=True)
        self.count("contested" if contested else "miss")
        return found

    async def _without_stale_rivals(
        self,
        cands: list[Entry],
        sims: list[float],
        rival: float | None,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None,
    ) -> tuple[list[Entry], list[float], dict[str, bool | None]]:
        """While two or more candidates are at the rival cosine, those whose payload is gone
        are stale vectors: removed, so that they contest nothing (otherwise an evicted answer
        would keep its neighbourhood shut until the entry's TTL). Only then: a lookup with one
        close candidate checks the payload of its pick alone, as before. The answers it got
        come back too, so that no payload is asked for twice."""
        there: dict[str, bool | None] = {}
        if rival is None or payload_exists is None or sum(s >= rival for s in sims) < 2:
            return cands, sims, there
        keep: list[tuple[Entry, float]] = []
        for c, s in zip(cands, sims, strict=True):
            if s >= rival:
                there[c.exact_key] = await payload_exists(c.exact_key)
                if there[c.exact_key] is False:
                    await self.remove_key(c.exact_key)
                    continue
            keep.append((c, s))
        return [c for c, _ in keep], [s for _, s in keep], there

    @staticmethod
    async def _payload(
        key: str,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None,
        there: dict[str, bool | None],
    ) -> bool | None:
        """True: the payload is there for this request; False: gone; None: not for it."""
        if key in there:
            return there[key]
        return True if payload_exists is None else await payload_exists(key)

    def _info(self, ident: int, entry: Entry) -> TextInfo:
        info = self._infos.get(ident)
        if info is None:
            info = self._infos[ident] = self.text_info(entry.text)
            if len(self._infos) > INFO_CACHE:
                self._infos.popitem(last=False)
        else:
            self._infos.move_to_end(ident)
        return info

    async def add(
        self,
        namespace: str,
        text: str,
        exact_key: str,
        ttl: float,
        vector: np.ndarray | None = None,
    ) -> Entry:
        vec = await self.embed(text) if vector is None else vector
        entry = Entry(namespace, exact_key, text, vec, time.time() + ttl)
        self.apply_add(entry)
        if self.replicator is not None:
            await self.replicator.publish_add(entry)
        return entry

    async def remove_key(self, exact_key: str) -> bool:
        removed = self.apply_remove(exact_key)
        if self.replicator is not None:
            await self.replicator.publish_remove(exact_key)
        return removed

    async def report_wrong(self, exact_key: str, score: float) -> bool:
        """A client said this hit was wrong: only a closer match than `score` may reuse it, in
        every process that shares the index."""
        e = self.entries.get(entry_id(exact_key))
        if e is None:
            return False
        self.apply_bar(exact_key, score + TIGHTEN_STEP)
        self.metrics.feedback.inc()
        if self.replicator is not None:
            vec = self.index.vector(entry_id(exact_key))
            await self.replicator.publish_bar(dataclasses.replace(e, vector=vec))
        return True
