"""The semantic stage: embed → search the namespace → verify → the exact key of a stored answer.

Entries hold only a vector, a namespace, the text's features and the exact key of the payload
(which lives once, in the exact store). An entry goes when its TTL passes, when the exact entry
is purged (`remove_key`), or when a lookup finds its payload gone. Adds and removals are also
published through an optional `Replicator` (cache.semantic.sync) to other gateway processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cache.embedder import Embedder
from cache.semantic.features import TextInfo, text_info
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.verifier import Decision, Verifier

log = logging.getLogger("latentgate.semantic")

TOP_K = 5
# A wrong-hit report raises that entry's bar to this verifier score (cosine when verifier off).
TIGHTEN_STEP = 0.03


def entry_id(exact_key: str) -> int:
    """63-bit id for FAISS from the exact key (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(exact_key.encode(), digest_size=8).digest(), "big") >> 1


@dataclass
class Entry:
    namespace: str
    exact_key: str
    text: str
    vector: np.ndarray
    expires_at: float  # wall clock (time.time), shared between processes
    info: TextInfo = field(init=False)
    bar: float = 0.0  # per-entry threshold raised by wrong-hit reports

    def __post_init__(self) -> None:
        self.info = text_info(self.text)


@dataclass(frozen=True, slots=True)
class SemanticHit:
    exact_key: str
    similarity: float
    score: float


class Replicator(Protocol):
    async def publish_add(self, entry: Entry) -> None: ...

    async def publish_remove(self, exact_key: str) -> None: ...

    async def publish_bar(self, entry: Entry) -> None: ...


class SemanticStage:
    """One per gateway process; routes share it, namespaces keep them apart."""

    enabled = True

    def __init__(
        self,
        embedder: Embedder,
        index: VectorIndex,
        metrics: SemanticMetrics,
        max_entries: int = 100_000,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.metrics = metrics
        self.max_entries = max_entries
        self.entries: dict[int, Entry] = {}
        self.replicator: Replicator | None = None
        # False while the embedder loads (cache.semantic.setup): routes skip the stage meanwhile.
        self.ready = True
        metrics.device.labels(embedder.device, index.device).set(1)

    async def embed(self, text: str) -> np.ndarray:
        t = time.perf_counter()
        vec = await self.embedder.embed(text)
        self.metrics.latency.labels("embed").observe(time.perf_counter() - t)
        return vec

    async def lookup(
        self,
        namespace: str,
        text: str,
        verifier: Verifier,
        payload_exists: Callable[[str], Awaitable[bool]] | None = None,
        vector: np.ndarray | None = None,
    ) -> SemanticHit | None:
        vec = await self.embed(text) if vector is None else vector
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
        if not cands:
            self.metrics.lookups.labels("miss").inc()
            return None
        cos = np.asarray(sims, dtype=np.float32)
        args = (
            text_info(text),
            vec,
            [c.info for c in cands],
            np.stack([c.vector for c in cands]),
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
            self.metrics.lookups.labels("miss").inc()
            return None
        chosen = cands[decision.index]
        if payload_exists is not None and not await payload_exists(chosen.exact_key):
            # The payload expired or was evicted from the exact store: this vector is stale.
            await self.remove_key(chosen.exact_key)
            self.metrics.lookups.labels("stale").inc()
            return None
        self.metrics.lookups.labels("hit").inc()
        return SemanticHit(chosen.exact_key, float(cos[decision.index]), decision.score)

    def apply_add(self, entry: Entry) -> None:
        """Local index only (also what replication calls)."""
        ident = entry_id(entry.exact_key)
        if ident not in self.entries and len(self.entries) >= self.max_entries:
            self._evict_oldest()
        self.entries[ident] = entry
        self.index.add(entry.namespace, ident, entry.vector)
        self.metrics.size.set(len(self.entries))

    def apply_remove(self, exact_key: str) -> bool:
        return self._drop(entry_id(exact_key))

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
            await self.replicator.publish_bar(e)
        return True

    def apply_bar(self, exact_key: str, bar: float) -> bool:
        """Raise (never lower) one entry's bar; local only (also what replication calls)."""
        e = self.entries.get(entry_id(exact_key))
        if e is None:
            return False
        e.bar = min(max(e.bar, bar), 1.01)
        return True

    def purge_expired(self) -> int:
        now = time.time()
        dead = [i for i, e in self.entries.items() if e.expires_at <= now]
        for i in dead:
            self._drop(i)
        return len(dead)

    def _drop(self, ident: int) -> bool:
        existed = self.entries.pop(ident, None) is not None
        self.index.remove(ident)
        self.metrics.size.set(len(self.entries))
        return existed

    def _evict_oldest(self) -> None:
        oldest = min(self.entries, key=lambda i: self.entries[i].expires_at)
        self._drop(oldest)
