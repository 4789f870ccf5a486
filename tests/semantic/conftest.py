"""Fixtures for the semantic cache tests: the real MiniLM embedder and verifier, loaded once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from cache.embedder import Embedder, load_embedder
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    yield load_embedder()


@pytest.fixture(scope="session")
def verifier() -> MlpVerifier:
    return MlpVerifier.load()


@pytest.fixture
def stage(embedder: Embedder) -> SemanticStage:
    return SemanticStage(
        embedder, VectorIndex(embedder.dim, device="cpu"), SemanticMetrics(CollectorRegistry())
    )
