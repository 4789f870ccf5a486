"""What would stop the semantic stage from starting (`check-config` and `serve` say it first)."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cache.semantic.cross_encoder import DEFAULT_ARTIFACT
from cache.semantic.verifier import DEFAULT_ARTIFACT as MLP_ARTIFACT
from cache.semantic.verifier import MlpVerifier
from cache.settings import CachePolicy, CacheSettings


class RouteLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def cache(self) -> CachePolicy: ...


def preflight(settings: CacheSettings, routes: Sequence[RouteLike]) -> list[str]:
    """What would stop the semantic stage from starting here (check-config and serve say it)."""
    problems = []
    mlp_checked = False
    for r in routes:
        p = r.cache.semantic
        # (a route without the exact cache keeps its semantic stage off: no verifier loads)
        if p.enabled and p.verifier in ("on", "features") and r.cache.exact.enabled:
            if not mlp_checked and (problem := _mlp_problem(settings.semantic.verifier_artifact)):
                problems.append(f"route {r.name}: {problem}")
            mlp_checked = True
        if p.enabled and p.verifier == "cross-encoder":
            path = settings.semantic.cross_encoder_artifact or str(DEFAULT_ARTIFACT)
            if not Path(path).is_file():
                problems.append(
                    f"route {r.name}: verifier 'cross-encoder' needs its artifact {path}: train "
                    "it with `python -m bench.train_cross_encoder` (or set "
                    "cache.semantic.cross_encoder_artifact)"
                )
    return problems


def _mlp_problem(configured: str | None) -> str | None:
    """The verifier MLP loads while the app is built: a missing or unreadable file ended the
    start in a traceback. Loading it is cheap (a few arrays)."""
    path = configured or str(MLP_ARTIFACT)
    setting = "cache.semantic.verifier_artifact"
    if not Path(path).is_file():
        return f"verifier {path} does not exist ({setting})"
    try:
        MlpVerifier.load(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        # (numpy's own words for a file that is no .npz speak of pickles: not said)
        return f"verifier {path} is not a verifier artifact, an .npz of its arrays ({setting})"
    return None
