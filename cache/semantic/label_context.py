"""What a label means on a route, as a short digest: shared counts and tenant labels are kept
per digest, so labels gathered under another scorer, point, rival rule or answer match never
prove this route's bar (cache.semantic.budget_store, cache.semantic.tenant_labels). The
embedder's space joins the digest once it has loaded (in_space)."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from cache.semantic.budget_prior import digest
from cache.semantic.verifier import DEFAULT_ARTIFACT, MlpVerifier, Verifier
from cache.settings import SemanticPolicy


def label_context(
    scorer: Verifier, ver: Verifier, p: SemanticPolicy, verifier_artifact: str | None
) -> str:
    """A short digest of what a label means on this route: the scorer (its name, its artifact's
    bytes), the floor it scores from, the shipped point, the rival rule and the answer match."""
    artifact = ""
    if isinstance(ver, MlpVerifier):
        path = Path(verifier_artifact) if verifier_artifact else DEFAULT_ARTIFACT
        with contextlib.suppress(OSError):
            artifact = digest(path)
    parts = (
        scorer.name,
        artifact,
        f"{scorer.floor:.4f}",
        f"{ver.floor:.4f}",
        f"{ver.p_min:.4f}",
        str(p.rival_cosine),
        p.answer_match,
        f"{p.answer_cosine:.4f}" if p.answer_match == "embedding" else "",
        p.judge.model if p.judge is not None and p.answer_match == "judge" else "",
    )
    return hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()


def in_space(context: str, space: str) -> str:
    """The context of labels made with one embedder (cache.embedder.embedding_space): a label's
    cosine is a distance between that embedder's vectors, and says nothing under another."""
    return hashlib.blake2b(f"{context}|{space}".encode(), digest_size=6).hexdigest()
