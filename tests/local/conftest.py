"""Fixtures for local engines: the real MiniLM, loaded once per session, and its reference model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.local.text_encoder import TextEncoder, load_text_encoder

STSB = Path("/work/shared/data/stsb/sts-dev.csv")
SENTENCES = [
    "A man is playing a guitar.",
    "hi",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Ein Mann spielt Gitarre.",
    "What is the capital of France?",
    "embedding " * 60,
]


def artifacts_dir() -> str | None:
    # Unset: the default per-user cache, so the one-time ONNX export is shared across runs.
    return os.environ.get("LATENTGATE_ARTIFACTS") or None


@pytest.fixture(scope="session")
def encoder() -> Iterator[TextEncoder]:
    enc = load_text_encoder(providers=["CPUExecutionProvider"], artifacts_dir=artifacts_dir())
    yield enc
    # The batcher's worker thread is joined by aclose; run it on a throwaway loop.
    import asyncio

    asyncio.run(enc.aclose())


@pytest.fixture(scope="session")
def reference() -> Any:
    """sentence-transformers on the same packaged weights: what users compare against."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from backends.local.artifacts import builtin_dir

    return SentenceTransformer(str(builtin_dir("all-MiniLM-L6-v2")), device="cpu")


def st_encode(reference: Any, texts: list[str]) -> np.ndarray:
    return np.asarray(reference.encode(texts, normalize_embeddings=True), np.float32)
