"""What would stop the semantic stage from starting (`check-config` and `serve` say it first)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cache.semantic.cross_encoder import DEFAULT_ARTIFACT
from cache.settings import CachePolicy, CacheSettings


class RouteLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def cache(self) -> CachePolicy: ...


def preflight(settings: CacheSettings, routes: Sequence[RouteLike]) -> list[str]:
    """What would stop the semantic stage from starting here (check-config and serve say it)."""
    problems = []
    for r in routes:
        p = r.cache.semantic
        if p.enabled and p.verifier == "cross-encoder":
            path = settings.semantic.cross_encoder_artifact or str(DEFAULT_ARTIFACT)
            if not Path(path).is_file():
                problems.append(
                    f"route {r.name}: verifier 'cross-encoder' needs its artifact {path}: train "
                    "it with `python -m bench.train_cross_encoder` (or set "
                    "cache.semantic.cross_encoder_artifact)"
                )
    return problems
