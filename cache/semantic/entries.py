"""The semantic stage's entries: kept oldest first, bounded by count and by bytes (`max_bytes`,
an estimate calibrated by bench/semantic_memory.py), the oldest evicted first; added, removed,
expired and re-barred locally (what replication applies too). The vector lives only in the
index. The stage (cache.semantic.stage) does the lookups."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import OrderedDict

from cache.semantic.features import TextInfo
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.records import Entry, entry_id

# Python's cost of one entry beyond its strings and its vector: the Entry object, its floats, the
# stage's and the index's dict slots and int keys (measured by bench/semantic_memory.py).
ENTRY_OVERHEAD = 400


class EntryBook:
    """Entries by id, in insertion order; the oldest goes first when a bound is reached."""

    def __init__(
        self, index: VectorIndex, metrics: SemanticMetrics, max_entries: int, max_bytes: int
    ) -> None:
        self.index = index
        self.metrics = metrics
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries: dict[int, Entry] = {}  # oldest first (insertion order)
        self.nbytes = 0
        # text features of recent candidates (the stage fills it): forgotten with their entry
        self._infos: OrderedDict[int, TextInfo] = OrderedDict()
        metrics.index_bytes.set_function(lambda: self.nbytes)

    def _cost(self, entry: Entry) -> int:
        return ENTRY_OVERHEAD + len(entry.text) + len(entry.exact_key) + self.index.vector_bytes()

    def apply_add(self, entry: Entry) -> None:
        """Local index only (also what replication calls). The caller's entry keeps its vector;
        the stored copy does not."""
        assert entry.vector is not None
        ident = entry_id(entry.exact_key)
        bar = entry.bar
        if (old := self.entries.get(ident)) is not None:
            # re-added: it becomes the newest, and keeps a bar a wrong-hit report raised (the
            # report was about which paraphrases this question answers, not about one answer)
            bar = max(bar, old.bar)
            self._drop(ident)
        cost = self._cost(entry)
        while self.entries and (
            len(self.entries) >= self.max_entries or self.nbytes + cost > self.max_bytes
        ):
            self._drop(next(iter(self.entries)))  # the oldest
        self.index.add(entry.namespace, ident, entry.vector)
        self.entries[ident] = dataclasses.replace(
            entry, namespace=sys.intern(entry.namespace), vector=None, bar=bar
        )
        self.nbytes += cost
        self.metrics.size.set(len(self.entries))

    def apply_remove(self, exact_key: str) -> bool:
        return self._drop(entry_id(exact_key))

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
        entry = self.entries.pop(ident, None)
        self.index.remove(ident)
        self._infos.pop(ident, None)
        if entry is not None:
            self.nbytes -= self._cost(entry)
        self.metrics.size.set(len(self.entries))
        return entry is not None
