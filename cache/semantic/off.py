"""The semantic stage for policies without one: every lookup misses, nothing is stored."""

from __future__ import annotations

from typing import Any


class SemanticOff:
    enabled = False

    async def lookup(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def add(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def remove_key(self, *args: Any, **kwargs: Any) -> None:
        return None
