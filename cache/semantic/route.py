"""One route's semantic policy applied to a Call: when it may look up or store, and where.

The HTTP-side cache stage calls `lookup` after an exact miss and `remember` after an exact
store; this module knows the policy (enabled, min_chars, only_deterministic, ttl) and the
namespace, never HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from cache.semantic.namespace import namespace_of
from cache.semantic.stage import SemanticHit, SemanticStage
from cache.semantic.verifier import Verifier
from cache.settings import SemanticPolicy


class CallLike(Protocol):
    """The fields of gateway.protocols.base.Call this needs (cache must not import gateway)."""

    model: str | None
    deterministic: bool
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

    def skip_reason(self, call: CallLike) -> str | None:
        """Why the stage does not look this call up (None: it does). Reasons: "disabled",
        "no_text" (no final user text), "too_short" (< min_chars), "too_long" (> max_chars,
        decided on the length alone: nothing is tokenised), "sampled" (not deterministic),
        "loading" (the embedder is not loaded yet)."""
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
        payload_exists: Callable[[str], Awaitable[bool]] | None = None,
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
