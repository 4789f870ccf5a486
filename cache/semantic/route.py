"""One route's semantic policy applied to a Call: when it may look up or store, and where.

The HTTP-side cache stage calls `lookup` after an exact miss and `remember` after an exact
store; this module knows the policy (enabled, min_chars, only_deterministic, ttl) and the
namespace, never HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from cache.codec import CacheEntry
from cache.semantic.budget import Bar
from cache.semantic.learn import RouteBudget, Stored
from cache.semantic.namespace import namespace_of
from cache.semantic.pending import Flight, Joined, PendingFlights
from cache.semantic.records import Candidate, Search, SemanticHit
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import Verifier
from cache.settings import SemanticPolicy


class CallLike(Protocol):
    """The fields of gateway.protocols.base.Call this needs (cache must not import gateway)."""

    model: str | None
    deterministic: bool
    greedy: bool
    semantic_text: str | None
    context: Any


class SemanticRoute:
    def __init__(
        self, stage: SemanticStage, route: str, policy: SemanticPolicy, verifier: Verifier
    ) -> None:
        self.stage = stage
        self.route = route
        self.policy = policy
        self.verifier = verifier
        # Set (by cache.semantic.setup) when the policy has max_error_rate: the bar is learned.
        self.budget: RouteBudget | None = None
        self.pending = PendingFlights(stage.text_info)

    def skip_reason(self, call: CallLike) -> str | None:
        """Why the stage does not look this call up (None: it does). Reasons: "disabled",
        "no_text" (no final user text, or an answer quoting its prompt), "too_short"
        (< min_chars), "too_long" (> max_chars, decided on the length alone: nothing is
        tokenised), "sampled" (not deterministic),
        "loading" (the embedder is not loaded yet), "not_unicode" (a lone surrogate, which JSON
        lets through and no tokeniser takes)."""
        text = call.semantic_text
        if not self.stage.ready:
            return "loading"  # the embedder loads in the background after start-up
        if not self.policy.enabled:
            return "disabled"
        if text is None:
            return "no_text"
        if len(text) > self.policy.max_chars:
            return "too_long"
        if len(text.strip()) < self.policy.min_chars:
            return "too_short"
        if not call.deterministic and self.policy.only_deterministic:
            return "sampled"
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                return "not_unicode"
        return None

    def applies(self, call: CallLike) -> bool:
        return self.skip_reason(call) is None

    def namespace(self, call: CallLike, tenant: str) -> str:
        return namespace_of(self.route, call.model, call.context, tenant)

    async def embed(self, call: CallLike) -> np.ndarray | None:
        """The call's vector, when the policy applies: a lookup that misses hands it on to
        `remember`, so a miss costs one embedding, not two."""
        if not self.applies(call):
            return None
        assert call.semantic_text is not None
        return await self.stage.embed(call.semantic_text)

    async def lookup(
        self,
        call: CallLike,
        tenant: str,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
    ) -> SemanticHit | None:
        if not self.applies(call):
            return None
        assert call.semantic_text is not None
        return await self.stage.lookup(
            self.namespace(call, tenant),
            call.semantic_text,
            self.verifier,
            payload_exists,
            vector,
            self.policy.rival_cosine,
        )

    async def remember(
        self,
        call: CallLike,
        tenant: str,
        exact_key: str,
        exact_ttl: float | None = None,
        vector: np.ndarray | None = None,
    ) -> bool:
        if not self.applies(call):
            return False
        assert call.semantic_text is not None
        ttl = self.policy.ttl if exact_ttl is None else min(self.policy.ttl, exact_ttl)
        ns = self.namespace(call, tenant)
        await self.stage.add(ns, call.semantic_text, exact_key, ttl, vector)
        return True

    # -- the flow's API (error budget, semantic single flight) -----------------------------

    def bar(self, tenant: str | None = None) -> Bar | None:
        """The learned bar (None: no budget); with `tenant`, the one that tenant is served at."""
        return None if self.budget is None else self.budget.bar(tenant)

    async def search(
        self,
        call: CallLike,
        tenant: str,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
        own_key: str | None = None,
        defer_miss: bool = False,
    ) -> Search:
        """`lookup` plus, on a route with an error budget, the best candidate it did not serve
        (hand it to `label_after_miss` once the upstream has answered; never the request's own
        entry, `own_key`). Without a budget the hit is exactly `lookup`'s and the candidate is
        None. defer_miss: a miss comes back `missed` and uncounted; the caller `count`s it (a
        paraphrase in flight may still serve the request: then it is a hit)."""
        if not self.applies(call):
            return Search(None, None)
        assert call.semantic_text is not None
        ns, text, rival = self.namespace(call, tenant), call.semantic_text, self.policy.rival_cosine
        if self.budget is None:
            return await self.stage.find(
                ns, text, self.verifier, payload_exists, vector, rival, defer_miss
            )
        return await self.stage.search(
            ns,
            text,
            self.budget.scorer,
            self.budget.bar(tenant),
            payload_exists,
            vector,
            self.budget.observer(tenant),
            rival,
            own_key,
            defer_miss,
        )

    def count(self, result: str) -> None:
        """A lookup's result on /metrics (`lookups{result}`): the flow counts the miss it asked
        `search` to leave to it, or the hit a paraphrase in flight served instead."""
        self.stage.count(result)

    def labels(self, call: CallLike) -> bool:
        """Answers to this call may label: a budget, a deterministic call, and under exact
        answer matching a greedy one (a seeded sampled answer to a rewording samples another
        path: it would disagree whatever the question meant, and shut the bar for everyone)."""
        if self.budget is None or not call.deterministic:
            return False
        return call.greedy or not self.budget.exact_match

    def label_after_miss(
        self,
        call: CallLike,
        tenant: str,
        candidate: Candidate | None,
        stored: Stored,
        fresh: CacheEntry,
    ) -> None:
        """Background: the fresh answer against the unserved candidate's stored one (stored: the
        entry, or an async loader of it). Never raises, never waits."""
        if candidate is None or self.budget is None or not self.labels(call):
            return
        self.budget.label_after_miss(candidate, call.semantic_text or "", stored, fresh, tenant)

    def should_audit(self, call: CallLike, hit: SemanticHit, may_audit: bool = True) -> bool:
        """Counts a served hit; True for the share to audit (only calls that may label: a
        seeded sampled hit is served and counted, never audited)."""
        if self.budget is None:
            return False
        return self.budget.should_audit(hit, may_audit and self.labels(call))

    def audit(
        self,
        call: CallLike,
        tenant: str,
        hit: SemanticHit,
        stored: Stored,
        fetch: Callable[[], Awaitable[CacheEntry | None]],
    ) -> None:
        """Background: fetch a fresh answer (bypassing the cache) and label the hit by it."""
        if self.budget is not None:
            self.budget.audit(hit, call.semantic_text or "", stored, fetch, tenant)

    async def join(
        self, call: CallLike, tenant: str, vector: np.ndarray, stored_rivals: int = 0
    ) -> Joined | None:
        """Semantic single flight: an in-flight miss in this namespace whose question the
        lookup rule would serve for this one; `await joined.wait(seconds)` gives its answer
        (None: the leader failed or was too slow; go upstream). stored_rivals: the stored
        questions the lookup found at the rival cosine (Search.rivals), which contest a
        flight as they would a stored candidate."""
        if not self.applies(call):
            return None
        assert call.semantic_text is not None
        ver: Verifier = self.verifier
        bar: Bar | None = None
        if self.budget is not None:
            bar, ver = self.budget.bar(tenant), self.budget.scorer
        return await self.pending.find(
            self.namespace(call, tenant),
            call.semantic_text,
            vector,
            ver,
            bar,
            self.policy.rival_cosine,
            stored_rivals,
        )

    def begin(
        self, call: CallLike, tenant: str, vector: np.ndarray, key: str = ""
    ) -> Flight | None:
        """Announce this miss's flight (key: its exact key); the caller must `finish` (or
        `fail`) it."""
        if not self.applies(call):
            return None
        assert call.semantic_text is not None
        ns = self.namespace(call, tenant)
        return self.pending.begin(ns, call.semantic_text, vector, key)
