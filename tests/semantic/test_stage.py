"""SemanticStage: hits inside a namespace, refusals, expiry, purge, stale payloads, feedback."""

from __future__ import annotations

import asyncio

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
    # The bar is that entry's own: other entries in the namespace still hit.
    await stage.add("ns", "What is the best way to learn Python?", "k2", ttl=60)
    assert await stage.lookup("ns", "What's the best way to learn Python?", verifier) is not None
