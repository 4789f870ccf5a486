"""Fixtures for the semantic cache tests: the real MiniLM embedder and verifier, loaded once."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from cache.embedder import Embedder, load_embedder
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier


class LoopFree:
    """The session's encoder without its batcher: pytest gives each test its own event loop,
    and the batcher's task belongs to the loop that started it (gateway tests use it fully)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim, self.device, self.backend = inner.dim, inner.device, inner.backend

    async def embed(self, text: str) -> np.ndarray:
        out: np.ndarray = self.inner.embed_sync([text])[0]
        return out

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed_sync(texts)

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    yield LoopFree(load_embedder())


@pytest.fixture(scope="session")
def verifier() -> MlpVerifier:
    return MlpVerifier.load()


@pytest.fixture
def stage(embedder: Embedder) -> SemanticStage:
    return SemanticStage(
        embedder, VectorIndex(embedder.dim, device="cpu"), SemanticMetrics(CollectorRegistry())
    )
