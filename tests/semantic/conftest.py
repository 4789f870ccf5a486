"""Fixtures for the semantic cache tests: the real MiniLM embedder and verifier, loaded once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from backends.local.artifacts import builtin_dir
from cache.embedder import Embedder, load_embedder
from cache.semantic.cross_encoder import CrossEncoder, save_artifact
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from tests.support.class_upstream import build_class_upstream
from tests.support.servers import ServerThread


class LoopFree:
    """The session's encoder without its batcher: pytest gives each test its own event loop,
    and the batcher's task belongs to the loop that started it (gateway tests use it fully)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim, self.device, self.backend = inner.dim, inner.device, inner.backend
        self.space = inner.space

    async def embed(self, text: str) -> np.ndarray:
        out: np.ndarray = self.inner.embed_sync([text])[0]
        return out

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed_sync(texts)

    def unseen(self, text: str) -> tuple[str, ...]:
        return self.inner.unseen(text)

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    yield LoopFree(load_embedder())


@pytest.fixture(scope="session")
def verifier() -> MlpVerifier:
    return MlpVerifier.load()


@pytest.fixture(scope="session")
def ce_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cross-encoder artifact in the trainer's format: the packaged MiniLM's first layer and a
    random head. Untrained (no trained one ships): for the plumbing, not for its judgement."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModel

    torch.manual_seed(0)
    bert = AutoModel.from_pretrained(
        str(builtin_dir("all-MiniLM-L6-v2")), num_hidden_layers=1, add_pooling_layer=False
    )
    weights = {f"encoder.{k}": v.numpy() for k, v in bert.encoder.state_dict().items()}
    weights["head.weight"] = torch.randn(1, 384).numpy() * 0.5
    weights["head.bias"] = np.zeros(1, np.float32)
    path = tmp_path_factory.mktemp("ce") / "ce.npz"
    save_artifact(path, weights, {"layers": 1, "max_tokens": 64, "floor": 0.8, "p_min": 0.5})
    return path


@pytest.fixture(scope="session")
def cross_encoder(
    ce_artifact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrossEncoder]:
    model = CrossEncoder.load(ce_artifact, artifacts_dir=str(tmp_path_factory.mktemp("art")))
    yield model
    model.close()


@pytest.fixture
def stage(embedder: Embedder) -> SemanticStage:
    return SemanticStage(
        embedder, VectorIndex(embedder.dim, device="cpu"), SemanticMetrics(CollectorRegistry())
    )


@pytest.fixture
def answers() -> dict[str, str]:
    """The class upstream's answers by question (a test module overrides this fixture)."""
    return {}


@pytest.fixture
def class_upstream(answers: dict[str, str]) -> Iterator[ServerThread]:
    """An upstream that answers each question by its class (tests.support.class_upstream)."""
    server = ServerThread(lambda: build_class_upstream(answers)).start()
    yield server
    server.stop()
