"""SemanticStage: hits inside a namespace, refusals, expiry, purge, stale payloads, feedback,
the byte bound."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from cache.embedder import Embedder
from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.records import entry_id
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier

Q = "How do I reset my password?"
PARA = "How can I reset my password?"


async def test_paraphrase_hits_same_namespace_only(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    await stage.add("ns1", Q, "key-1", ttl=60)
    hit = await stage.lookup("ns1", PARA, verifier)
    assert hit is not None and hit.exact_key == "key-1" and hit.similarity > 0.9
    assert await stage.lookup("ns2", PARA, verifier) is None


async def test_swaps_are_refused_and_counted(stage: SemanticStage, verifier: MlpVerifier) -> None:
    await stage.add("ns", "What is 2+3?", "k", ttl=60)
    assert await stage.lookup("ns", "What is 2+4?", verifier) is None
    await stage.add("ns", "Is the Tabaci a tributary of the Leurda?", "k2", ttl=60)
    assert await stage.lookup("ns", "Is the Leurda a tributary of the Tabaci?", verifier) is None
    assert stage.metrics.refusals._value.get() >= 1  # a candidate over the floor, turned down


async def test_expired_entry_is_a_miss_and_its_vector_goes(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    await stage.add("ns", Q, "k", ttl=0.05)
    await asyncio.sleep(0.06)
    assert await stage.lookup("ns", PARA, verifier) is None
    assert len(stage.index) == 0 and not stage.entries


async def test_purge_removes_the_vector(stage: SemanticStage, verifier: MlpVerifier) -> None:
    await stage.add("ns", Q, "k", ttl=60)
    assert await stage.remove_key("k")
    assert len(stage.index) == 0
    assert await stage.lookup("ns", PARA, verifier) is None


async def test_payload_gone_is_a_miss_and_removes(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    await stage.add("ns", Q, "k", ttl=60)

    async def gone(key: str) -> bool:
        return False

    assert await stage.lookup("ns", PARA, verifier, payload_exists=gone) is None
    assert len(stage.index) == 0


async def test_wrong_hit_report_stops_that_reuse(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    await stage.add("ns", Q, "k", ttl=60)
    hit = await stage.lookup("ns", PARA, verifier)
    assert hit is not None
    assert await stage.report_wrong("k", hit.score)
    assert await stage.lookup("ns", PARA, verifier) is None
    # The same question stored again (its answer expired and was asked anew) keeps its bar:
    # the report was about which paraphrases it answers.
    await stage.add("ns", Q, "k", ttl=60)
    assert await stage.lookup("ns", PARA, verifier) is None
    # The bar is that entry's own: other entries in the namespace still hit.
    await stage.add("ns", "What is the best way to learn Python?", "k2", ttl=60)
    assert await stage.lookup("ns", "What's the best way to learn Python?", verifier) is not None


async def test_byte_bound_evicts_the_oldest_and_is_in_metrics(embedder: Embedder) -> None:
    registry = CollectorRegistry()
    index = VectorIndex(embedder.dim, device="cpu")
    probe = SemanticStage(embedder, index, SemanticMetrics(CollectorRegistry()))
    first = await probe.add("ns", "How do I reset my password?", "k0", ttl=60)
    one = probe.nbytes
    assert one > index.vector_bytes()
    # room for about three entries of this size: the fourth and fifth push out the oldest
    stage = SemanticStage(
        embedder,
        VectorIndex(embedder.dim, device="cpu"),
        SemanticMetrics(registry),
        max_bytes=int(one * 3.5),
    )
    texts = [
        "How do I reset my password?",
        "What is the capital of France?",
        "How many legs does a spider have?",
        "Why is the sky blue?",
        "Who wrote the novel Moby Dick?",
    ]
    for i, t in enumerate(texts):
        # the oldest to go is the first added, even with the latest expiry
        await stage.add("ns", t, f"k{i}", ttl=600 - i)
    assert [e.exact_key for e in stage.entries.values()] == ["k2", "k3", "k4"]
    assert stage.nbytes <= int(one * 3.5)
    assert entry_id("k0") not in stage.index and len(stage.index) == 3
    found = stage.index.search("ns", await stage.embed(texts[4]), 1)
    assert found[0][0] == entry_id("k4")
    value = registry.get_sample_value("latentgate_semantic_index_bytes")
    assert value == stage.nbytes
    assert first.vector is not None  # the caller's entry keeps its vector for replication
    assert all(e.vector is None for e in stage.entries.values())  # the index holds it
