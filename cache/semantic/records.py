"""What the semantic stage hands around: its entries, a lookup's outcome, and the protocols of
the learned bar and of replication (plain data; cache.semantic.stage does the work)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np


def entry_id(exact_key: str) -> int:
    """63-bit id for FAISS from the exact key (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(exact_key.encode(), digest_size=8).digest(), "big") >> 1


@dataclass(slots=True)
class Entry:
    namespace: str
    exact_key: str
    text: str
    vector: np.ndarray | None  # None once stored: the index holds it
    expires_at: float  # wall clock (time.time), shared between processes
    bar: float = 0.0  # per-entry threshold raised by wrong-hit reports
    # The shared store (cache.semantic.sync) held this record: read from it, or its publication
    # confirmed. A gap rebuild drops such an entry once the store no longer holds it; one not
    # published yet (or whose publication failed: Redis down) is this process's own and stays.
    shared: bool = False


@dataclass(frozen=True, slots=True)
class SemanticHit:
    exact_key: str
    similarity: float
    score: float


@dataclass(frozen=True, slots=True)
class Candidate:
    """The best candidate a budgeted lookup did not serve: the miss that follows labels it."""

    exact_key: str
    similarity: float
    score: float
    served_by_bar: bool  # the route's bar would serve it (a per-entry bar or payload refused)


@dataclass(frozen=True, slots=True)
class Search:
    hit: SemanticHit | None
    candidate: Candidate | None
    # Stored questions at or over the route's rival cosine (cache.semantic.rivals): a paraphrase
    # in flight is contested by them too.
    rivals: int = 0
    # A miss the stage left uncounted (asked with defer_miss): the caller counts it, as a hit
    # when a paraphrase in flight serves the request after all.
    missed: bool = False


class Bar(Protocol):
    def serves(self, cosine: float, score: float) -> bool: ...


class Replicator(Protocol):
    async def publish_add(self, entry: Entry) -> None: ...

    async def publish_remove(self, exact_key: str) -> None: ...

    async def publish_bar(self, entry: Entry) -> None: ...
