"""The semantic stage of a route that has none: nothing applies, every lookup misses, nothing
is stored. The cache flow holds one of these instead of checking for None at every step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

from cache.semantic.records import SemanticHit
from cache.semantic.route import CallLike


class NoSemantic:
    enabled = False

    def skip_reason(self, call: CallLike) -> str | None:
        return "disabled"

    def applies(self, call: CallLike) -> bool:
        return False

    async def embed(self, call: CallLike) -> np.ndarray | None:
        return None

    async def lookup(
        self,
        call: CallLike,
        tenant: str,
        payload_exists: Callable[[str], Awaitable[bool | None]] | None = None,
        vector: np.ndarray | None = None,
    ) -> SemanticHit | None:
        return None

    async def remember(
        self,
        call: CallLike,
        tenant: str,
        exact_key: str,
        exact_ttl: float | None = None,
        vector: np.ndarray | None = None,
    ) -> bool:
        return False
