"""Processes share semantic vectors only within one embedding space: the same weights,
tokenizer and window (cache.embedder.embedding_space). A process with another embedder on the
same Redis and prefix (a rollout of a new model, a changed config and a restart) neither loads
the other's vectors nor sends it its own: their cosines would compare two unrelated spaces."""

from __future__ import annotations

import uuid

import numpy as np

from backends.local.text_encoder import load_text_encoder
from cache.embedder import (
    Embedder,
    SentenceTransformersEmbedder,
    TextEncoderEmbedder,
    packaged_model_dir,
)
from cache.semantic.sync import RedisSync
from cache.settings import RedisSettings
from tests.semantic.conftest import LoopFree
from tests.semantic.test_sync import new_stage
from tests.support.servers import RedisServer

Q = "How do I reset my password?"


def narrow() -> Embedder:
    """The same weights read through a 128-token window: another space."""
    return LoopFree(TextEncoderEmbedder(load_text_encoder(max_tokens=128)))


def test_the_onnx_engine_and_its_fallback_share_a_space_and_a_window_makes_another(
    embedder: Embedder,
) -> None:
    fallback = SentenceTransformersEmbedder(packaged_model_dir())
    assert fallback.space == embedder.space  # the same vectors, whichever runtime
    a, b = embedder.embed_sync([Q])[0], fallback.embed_sync([Q])[0]
    assert float(np.dot(a, b)) > 0.999
    assert narrow().space != embedder.space


async def test_processes_with_other_embedders_share_no_vectors(
    redis_server: RedisServer, embedder: Embedder
) -> None:
    settings = RedisSettings(url=redis_server.url, key_prefix=f"sp{uuid.uuid4().hex[:8]}:")
    a = new_stage(embedder)
    sa = RedisSync.from_settings(a, settings, block_ms=100)
    await sa.start()
    try:
        await a.add("ns", Q, "key-a", ttl=60)
        await sa.published()
        other = new_stage(narrow())
        so = RedisSync.from_settings(other, settings, block_ms=100)
        same = new_stage(embedder)
        ss = RedisSync.from_settings(same, settings, block_ms=100)
        assert await so.rebuild() == 0  # A's vector is not of its space
        assert await ss.rebuild() == 1  # (and is there for a process of A's)
        await so.aclose()
        await ss.aclose()
    finally:
        await sa.aclose()
